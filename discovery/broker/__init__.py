"""The embedded broker (pulsar-lite) that `toolreg up` runs when no `PULSAR_URL` is given, and its supervisor."""

from discovery.broker.embedded import EmbeddedBroker
from discovery.broker.supervisor import BrokerSupervisor

__all__ = ["BrokerSupervisor", "EmbeddedBroker"]

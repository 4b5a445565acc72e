"""The transport seam: what the product sees of a broker.

`open_transport(settings)` connects to the broker the settings name: Apache
Pulsar or pulsar-lite through `transport.pulsar` (the only package that imports
`pulsar`), or an in-process `MemoryBroker` for a `memory://` URL. Code above
this package uses only `Transport`, `Publisher`, `Subscription` and
`Envelope` (and, for replicated state, `ExclusivePublisher` and `Reader`),
and catches only the product's own errors.
"""

from __future__ import annotations

from ..brokers import APACHE_PULSAR, BROKER_KINDS, MEMORY, PULSAR_LITE
from ..settings import Settings
from .base import (
    EXCLUSIVE_MODES,
    LARGE_MESSAGE,
    MESSAGE_LIMIT,
    Capabilities,
    Envelope,
    ExclusiveMode,
    ExclusivePublisher,
    FailureHook,
    Handler,
    InlineHandler,
    Payload,
    Publisher,
    Reader,
    ReaderStart,
    SubscribeOptions,
    Subscription,
    SubscriptionOptions,
    Transport,
    broker_unreachable,
    encode,
    unique_name,
)
from .memory import SCHEME as MEMORY_SCHEME
from .memory import MemoryBroker, MemoryTransport


async def open_transport(settings: Settings | None = None, *, url: str | None = None) -> Transport:
    """Connect to `url`, or to the broker the settings resolve to.

    Raises `NoBrokerError` when none is configured, and a `TransportError`
    (with a one-line message) when the broker cannot be used.
    """
    settings = settings or Settings.from_env()
    target = url or settings.resolve_pulsar_url()
    if target.startswith(MEMORY_SCHEME):
        return MemoryBroker.named(target).transport(settings.topics)
    from .pulsar import PulsarTransport

    return await PulsarTransport.open(settings, url=target)


__all__ = [
    "APACHE_PULSAR",
    "BROKER_KINDS",
    "Capabilities",
    "EXCLUSIVE_MODES",
    "Envelope",
    "ExclusiveMode",
    "ExclusivePublisher",
    "FailureHook",
    "Handler",
    "InlineHandler",
    "LARGE_MESSAGE",
    "MESSAGE_LIMIT",
    "MEMORY",
    "MemoryBroker",
    "MemoryTransport",
    "PULSAR_LITE",
    "Payload",
    "Publisher",
    "Reader",
    "ReaderStart",
    "SubscribeOptions",
    "Subscription",
    "SubscriptionOptions",
    "Transport",
    "broker_unreachable",
    "encode",
    "open_transport",
    "unique_name",
]

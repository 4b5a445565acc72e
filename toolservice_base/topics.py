"""The well-known topics of the product, within one topicspace.

A topicspace is the Pulsar tenant every topic lives in (`tg` by default, the
same idea as TrustGraph's `topicspace`); `TOOLREG_TOPICSPACE` changes it, so
several deployments, or tests, share one Apache Pulsar cluster. A transport
carries the `Topics` of the topicspace it was opened for.

Every topic is non-persistent: requests, responses, pushes and announcements
are soft state (a lost one is retried, refetched or re-announced), and the
durable truth lives in the config store's SQLite file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_TOPICSPACE = "tg"
_TENANT = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")
NAMESPACES = ("request", "response", "notify", "discovery")
"""The namespaces the product uses inside its topicspace (deploy/pulsar-init.sh creates them)."""


def check_topicspace(value: str) -> str:
    if not _TENANT.match(value):
        raise ValueError(f"topicspace {value!r} is not a valid Pulsar tenant name (letters, digits, '-', '_', '.')")
    return value


@dataclass(frozen=True)
class Topics:
    """Every topic name the product uses, in one topicspace."""

    topicspace: str = DEFAULT_TOPICSPACE

    def __post_init__(self) -> None:
        check_topicspace(self.topicspace)

    def _topic(self, namespace: str, name: str) -> str:
        return f"non-persistent://{self.topicspace}/{namespace}/{name}"

    @property
    def config_request(self) -> str:
        return self._topic("request", "config")

    @property
    def config_response(self) -> str:
        return self._topic("response", "config")

    @property
    def config_notify(self) -> str:
        return self._topic("notify", "config")

    @property
    def tool_descriptors(self) -> str:
        return self._topic("discovery", "tool-descriptors")

    @property
    def tool_probe(self) -> str:
        return self._topic("discovery", "tool-probe")

    @property
    def registry_request(self) -> str:
        return self._topic("request", "tool-registry")

    @property
    def registry_response(self) -> str:
        return self._topic("response", "tool-registry")

    def request_queue(self, service_id: str) -> str:
        """The default request queue of a tool service."""
        return self._topic("request", service_id)

    def response_queue(self, service_id: str) -> str:
        """The default response queue of a tool service."""
        return self._topic("response", service_id)

    @property
    def queue_namespaces(self) -> tuple[str, str]:
        """Where tool services' queues may live unless the registry is told otherwise."""
        return (f"{self.topicspace}/request", f"{self.topicspace}/response")


DEFAULT = Topics()

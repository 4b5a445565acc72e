"""The well-known topics of the product, within one topicspace.

A topicspace is the Pulsar tenant every topic lives in (`tg` by default, the
same idea as TrustGraph's `topicspace`); `TOOLREG_TOPICSPACE` changes it, so
several deployments, or tests, share one Apache Pulsar cluster. A transport
carries the `Topics` of the topicspace it was opened for.

Requests, responses, pushes and announcements are non-persistent: soft state
(a lost one is retried, refetched or re-announced). The durable truth lives in
the config store: its SQLite file, or, with the `pulsar` backend, persistent
topics of the `state` namespace (a log, its snapshots, the locks that elect
the one writer), which keeps them without limit (deploy/pulsar-init.sh sets
its retention).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_TOPICSPACE = "tg"
_TENANT = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")
NAMESPACES = ("request", "response", "notify", "discovery", "state", "audit")
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

    def _persistent(self, namespace: str, name: str) -> str:
        return f"persistent://{self.topicspace}/{namespace}/{name}"

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

    @property
    def mcp_audit(self) -> str:
        """Every call through the MCP front (`AuditRecord`), when its audit topic is on: kept for the `audit`
        namespace's retention (deploy/pulsar-init.sh sets it)."""
        return self._persistent("audit", "mcp-calls")

    @property
    def state_log(self) -> str:
        """The config store's replicated log: every write, in order, kept without limit."""
        return self._persistent("state", "config-log")

    @property
    def state_snapshot(self) -> str:
        """Snapshots of the config store (chunks, then a manifest naming the log position they cover)."""
        return self._persistent("state", "config-snapshot")

    @property
    def state_lock(self) -> str:
        """The config store replicas' lock: whoever holds its exclusive producer is the one writer."""
        return self._persistent("state", "config-lock")

    @property
    def registry_lock(self) -> str:
        """The registry replicas' lock: whoever holds its exclusive producer is the active registry."""
        return self._persistent("state", "registry-lock")

    @property
    def state_members(self) -> str:
        """Every replica's status, once a second (`toolreg replicas`); soft state, so non-persistent."""
        return self._topic("state", "members")

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

"""The errors only an operator meets: the embedded broker, the registry, the replicated state.

They share the product's one root, `ToolDiscoveryError` (`toolservice_base.errors`),
so `toolreg` prints any of them as one line; they live here because a tool
service, the package its author installs, never raises them.
"""

from __future__ import annotations

from toolservice_base.errors import ToolDiscoveryError

__all__ = [
    "BrokerError",
    "ClusterAdminError",
    "KeyMismatch",
    "LogIncomplete",
    "NewerFormat",
    "NotActive",
    "RegistryError",
    "RegistryQueryError",
    "RegistryUnavailable",
    "ReplicationError",
]


class BrokerError(ToolDiscoveryError):
    """The embedded broker could not be started or supervised."""


class ClusterAdminError(ToolDiscoveryError):
    """Apache Pulsar's admin API refused, or could not be reached (`toolreg init`); the message says what to fix."""


# --- the registry ----------------------------------------------------------------------


class RegistryUnavailable(ToolDiscoveryError):
    """No registry answered in time."""


class RegistryQueryError(ToolDiscoveryError):
    """The registry answered with an error; `code` is its type (`bad-request`, `not-found`, ...)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class RegistryError(ToolDiscoveryError):
    """The registry could not start; the message says what to do."""


# --- replicated state on the broker -----------------------------------------------------


class ReplicationError(ToolDiscoveryError):
    """The replicated log or the election of its writer failed; the message says what to do."""


class NotActive(ReplicationError):
    """Only the active replica writes; this one is a standby (or was deposed). Send the write to the active one."""


class NewerFormat(ReplicationError):
    """The log holds an entry in a format this version cannot read: it stops rather than apply it wrongly. Upgrade."""


class LogIncomplete(ReplicationError):
    """The replicated log lacks entries the broker deleted (a `state` namespace that keeps no history, say).

    A replica stops rather than build, and serve, a state without the writes
    they held. `namespace` is the log's (`tenant/state`), where retention must be set.
    """

    def __init__(self, message: str, *, namespace: str) -> None:
        super().__init__(message)
        self.namespace = namespace


class KeyMismatch(ReplicationError):
    """This replica's group key (or its absence) is not the group's: it takes no part, and says which keys differ."""

"""The keys the registry's modules share: of a config item, and of a service; and how a stored item that cannot be
read back is told.

A module of its own so that every other module of the registry can name them
without importing the rules that use them (`merge`, `owners`, `leases`).
"""

from __future__ import annotations

from typing import NamedTuple

from toolservice_base.logs import get_logger

log = get_logger("discovery.registry")

Key = tuple[str, str]
"""(type, key) of a config item inside one workspace."""


class ServiceKey(NamedTuple):
    """One service, however many instances it runs: read by name (`key.workspace`, `key.service`), never by index."""

    workspace: str
    service: str
    """The service's id (`tool-service/<id>`)."""


def unreadable(key: Key, reason: Exception, workspace: str | None = None) -> None:
    """An item the registry wrote that it cannot read back at start (a pin, a pending change, an ownership record,
    the departed list): told in one shape and skipped, so one bad value never keeps the rest of the fleet from
    starting. Only the reason's first line: a validation error runs to many."""
    text = str(reason)
    log.warning(
        "registry.record_unreadable",
        key=f"{key[0]}/{key[1]}",
        workspace=workspace,
        reason=text.splitlines()[0] if text else type(reason).__name__,
    )

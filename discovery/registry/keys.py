"""The keys the registry's modules share: of a config item, and of a service.

A module of its own so that every other module of the registry can name them
without importing the rules that use them (`merge`, `owners`, `leases`).
"""

from __future__ import annotations

from typing import NamedTuple

Key = tuple[str, str]
"""(type, key) of a config item inside one workspace."""


class ServiceKey(NamedTuple):
    """One service, however many instances it runs: read by name (`key.workspace`, `key.service`), never by index."""

    workspace: str
    service: str
    """The service's id (`tool-service/<id>`)."""

"""The config store: `(workspace, type, key) -> value` and one version, served over Pulsar.

`service` answers the config protocol (ours and TrustGraph 2.11's) and pushes
changes, on the system queue and each workspace's (`workspace_queues`), while
`upkeep` keeps its file marked and backed up; `operations` turns one request into reads and writes; `sqlite` is the
embedded backend, with `check` (integrity) and `backup` beside it, and
`changes` its change feed (what changed since a version).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from discovery.lazy import lazy_exports

if TYPE_CHECKING:
    from discovery.store.changes import ChangeWindow
    from discovery.store.check import StoreAccessError, StoreDamaged
    from discovery.store.service import ConfigStoreService
    from discovery.store.sqlite import STORE_FILE, ConfigStore, ExpectationFailed, StoreError

# Loaded on first use: importing one module of this package (the CLI's client, say) loads only what that module needs.
_EXPORTS = {
    "ChangeWindow": "discovery.store.changes",
    "ConfigStore": "discovery.store.sqlite",
    "ConfigStoreService": "discovery.store.service",
    "ExpectationFailed": "discovery.store.sqlite",
    "STORE_FILE": "discovery.store.sqlite",
    "StoreAccessError": "discovery.store.check",
    "StoreDamaged": "discovery.store.check",
    "StoreError": "discovery.store.sqlite",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "ChangeWindow",
    "ConfigStore",
    "ConfigStoreService",
    "ExpectationFailed",
    "STORE_FILE",
    "StoreAccessError",
    "StoreDamaged",
    "StoreError",
]

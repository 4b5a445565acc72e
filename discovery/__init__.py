"""Operator side of tool discovery, a package per subsystem.

- `discovery.store`: the config store service and its backends
- `discovery.registry`: the registry (announcements in, merged config out) and its query client
- `discovery.broker`: the embedded broker and its supervisor
- `discovery.web`: health, metrics and the registry page
- `discovery.mcp`: the MCP front
- `discovery.cli`: `toolreg`, the one place that assembles the others
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from discovery.lazy import lazy_exports

if TYPE_CHECKING:
    from discovery.registry.client import RegistryClient
    from discovery.registry.options import RegistryOptions
    from discovery.registry.service import Registry
    from discovery.registry.trust import PolicyError, TrustPolicy
    from discovery.store.service import ConfigStoreService
    from discovery.store.sqlite import ConfigStore, ExpectationFailed, StoreError
    from toolservice_base.errors import RegistryError, RegistryQueryError, RegistryUnavailable

# Loaded on first use: importing one module of this package (the CLI's client, say) loads only what that module needs.
_EXPORTS = {
    "ConfigStore": "discovery.store.sqlite",
    "ConfigStoreService": "discovery.store.service",
    "ExpectationFailed": "discovery.store.sqlite",
    "PolicyError": "discovery.registry.trust",
    "Registry": "discovery.registry.service",
    "RegistryClient": "discovery.registry.client",
    "RegistryError": "toolservice_base.errors",
    "RegistryOptions": "discovery.registry.options",
    "RegistryQueryError": "toolservice_base.errors",
    "RegistryUnavailable": "toolservice_base.errors",
    "StoreError": "discovery.store.sqlite",
    "TrustPolicy": "discovery.registry.trust",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "ConfigStore",
    "ConfigStoreService",
    "ExpectationFailed",
    "PolicyError",
    "Registry",
    "RegistryClient",
    "RegistryError",
    "RegistryOptions",
    "RegistryQueryError",
    "RegistryUnavailable",
    "StoreError",
    "TrustPolicy",
]

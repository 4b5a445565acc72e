"""Operator side of tool discovery, a package per subsystem.

- `discovery.store`: the config store service and its backends
- `discovery.registry`: the registry (announcements in, merged config out) and its query client
- `discovery.broker`: the embedded broker and its supervisor
- `discovery.web`: health, metrics and the registry page
- `discovery.mcp`: the MCP front
- `discovery.replicas`: replica groups on the broker (election, replicated log, membership)
- `discovery.cli`: `toolreg`, the one place that assembles the others

Its errors (`discovery.errors`) are the ones only an operator meets, under the product's one root `ToolDiscoveryError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from discovery.lazy import lazy_exports

if TYPE_CHECKING:
    from discovery.errors import (
        BrokerError,
        LogIncomplete,
        NewerFormat,
        NotActive,
        RegistryError,
        RegistryQueryError,
        RegistryUnavailable,
        ReplicationError,
    )
    from discovery.registry.client import RegistryClient
    from discovery.registry.options import RegistryOptions
    from discovery.registry.service import Registry
    from discovery.registry.trust import PolicyError, TrustPolicy
    from discovery.store.service import ConfigStoreService
    from discovery.store.sqlite import ConfigStore, ExpectationFailed, StoreError

# Loaded on first use: importing one module of this package (the CLI's client, say) loads only what that module needs.
_EXPORTS = {
    "BrokerError": "discovery.errors",
    "LogIncomplete": "discovery.errors",
    "NewerFormat": "discovery.errors",
    "NotActive": "discovery.errors",
    "ReplicationError": "discovery.errors",
    "ConfigStore": "discovery.store.sqlite",
    "ConfigStoreService": "discovery.store.service",
    "ExpectationFailed": "discovery.store.sqlite",
    "PolicyError": "discovery.registry.trust",
    "Registry": "discovery.registry.service",
    "RegistryClient": "discovery.registry.client",
    "RegistryError": "discovery.errors",
    "RegistryOptions": "discovery.registry.options",
    "RegistryQueryError": "discovery.errors",
    "RegistryUnavailable": "discovery.errors",
    "StoreError": "discovery.store.sqlite",
    "TrustPolicy": "discovery.registry.trust",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "BrokerError",
    "LogIncomplete",
    "NewerFormat",
    "NotActive",
    "ReplicationError",
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

"""The registry: reads the `tool-descriptors` topic, keeps leases, merges live services into the config store.

`service` runs it (`Registry`); `validation` and `trust` decide what is let in;
`leases`, `departed` and `state` hold what it knows; `merge` and `writer` turn
that into store writes; `overview`, `protocol`, `paging` and `client` are its
query API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from discovery.lazy import lazy_exports

if TYPE_CHECKING:
    from discovery.registry.client import RegistryClient
    from discovery.registry.options import RegistryOptions
    from discovery.registry.service import Registry
    from discovery.registry.trust import PolicyError, TrustPolicy

# Loaded on first use: importing one module of this package (the CLI's client, say) loads only what that module needs.
_EXPORTS = {
    "PolicyError": "discovery.registry.trust",
    "Registry": "discovery.registry.service",
    "RegistryClient": "discovery.registry.client",
    "RegistryOptions": "discovery.registry.options",
    "TrustPolicy": "discovery.registry.trust",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["PolicyError", "Registry", "RegistryClient", "RegistryOptions", "TrustPolicy"]

"""The registry: reads the `tool-descriptors` topic, keeps leases, merges live services into the config store.

`service` wires it and runs its life cycle (`Registry`: `restore` at start,
`topic_watch` for readiness); `intake` takes every
announcement, judged by `validation`, `trust` and `pins` (its records and rules:
`pin_rules`); `leases`, `departed` and `state` hold what it knows, by the keys
of `keys`; `expiry` is the lease sweep and its policy
(lease expiry, self-preservation); `writer` and `batches` turn what changed into
store writes, planned by `merge` over `owners`; `queries`, `overview`,
`protocol`, `paging` and `client` are its query API. `replicated` is the
replicated registry (`ActiveRegistry`: the active replica runs a `Registry`,
standbys keep warm leases, `heard`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from discovery.lazy import lazy_exports

if TYPE_CHECKING:
    from discovery.registry.client import RegistryClient
    from discovery.registry.options import RegistryOptions
    from discovery.registry.replicated import ActiveRegistry
    from discovery.registry.service import Registry
    from discovery.registry.trust import PolicyError, TrustPolicy

# Loaded on first use: importing one module of this package (the CLI's client, say) loads only what that module needs.
_EXPORTS = {
    "ActiveRegistry": "discovery.registry.replicated",
    "PolicyError": "discovery.registry.trust",
    "Registry": "discovery.registry.service",
    "RegistryClient": "discovery.registry.client",
    "RegistryOptions": "discovery.registry.options",
    "TrustPolicy": "discovery.registry.trust",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["ActiveRegistry", "PolicyError", "Registry", "RegistryClient", "RegistryOptions", "TrustPolicy"]

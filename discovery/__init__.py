"""Operator side of tool discovery: the config store service, the registry and the `toolreg` CLI."""

from toolservice_base.errors import RegistryError, RegistryQueryError, RegistryUnavailable

from .configsvc import ConfigStoreService
from .registry import Registry, RegistryOptions
from .registry_client import RegistryClient
from .store import ConfigStore, Conflict, StoreError
from .trust import PolicyError, TrustPolicy

__all__ = [
    "ConfigStore",
    "ConfigStoreService",
    "Conflict",
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

"""Operator side of tool discovery: the config store service, the registry and the `toolreg` CLI."""

from .configsvc import ConfigStoreService
from .registry import Registry, RegistryError, RegistryOptions
from .registry_client import RegistryClient, RegistryUnavailable
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
    "RegistryUnavailable",
    "StoreError",
    "TrustPolicy",
]

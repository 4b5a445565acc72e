"""Operator side of tool discovery: the config store service, the registry and the `toolreg` CLI."""

from .configsvc import ConfigStoreService
from .store import ConfigStore, Conflict, StoreError

__all__ = ["ConfigStore", "ConfigStoreService", "Conflict", "StoreError"]

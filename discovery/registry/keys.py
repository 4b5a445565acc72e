"""The keys the registry's modules share: of a config item, and of a service.

A module of its own so that every other module of the registry can name them
without importing the rules that use them (`merge`, `owners`, `leases`).
"""

from __future__ import annotations

Key = tuple[str, str]
"""(type, key) of a config item inside one workspace."""

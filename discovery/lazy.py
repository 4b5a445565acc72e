"""Package faces that load on first use: `discovery.registry.Registry` imports the registry only when it is asked for.

Why: importing one module of a package runs the package's `__init__` first.
If that imported every public name, `toolreg trust list` (which needs the
registry's trust module) would load the registry service, the store and
more. Each package face instead names where its exports live, and Python's
module `__getattr__` (PEP 562) imports one when it is first read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports `exports[name]` (a module) and returns its `name`."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__

"""Static JSON files as a config source: `tool-service/<id>.json` and `tool/<name>.json`.

The same documents an operator writes into the store by hand, kept in a
directory (in git, in an image). The `ToolSet` reads them when the store does
not answer at start; the file name (without `.json`) is the item's key, and
each file is validated like a store item, so a bad file is one skipped tool.
"""

from __future__ import annotations

from pathlib import Path

from toolservice_base.errors import ToolDiscoveryError

from .build import TYPES, Items


class StaticDirError(ToolDiscoveryError, ValueError):
    """The static directory cannot be used; the message says what to fix."""


def load_static_dir(directory: str | Path) -> Items:
    """Raw items from `directory`, keyed by type then file stem."""
    root = Path(directory)
    if not root.is_dir():
        raise StaticDirError(
            f"static directory {root} does not exist; create it with tool/*.json and tool-service/*.json"
        )
    items: dict[str, dict[str, str]] = {t: {} for t in TYPES}
    for item_type in TYPES:
        folder = root / item_type
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            items[item_type][path.stem] = path.read_bytes().decode("utf-8", errors="replace")
    if not any(items.values()):
        raise StaticDirError(f"static directory {root} holds no tool/*.json or tool-service/*.json files")
    return items

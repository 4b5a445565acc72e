"""The last-known-good snapshot: what lets an agent start while the config store is down.

Written after every version the `ToolSet` applies from the store, as one JSON
file replaced atomically (write a temporary file, fsync, rename), so a crash
mid-write leaves the previous snapshot, never half of one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from toolservice_base.logs import get_logger

from .build import TYPES, Items

log = get_logger("agent_bridge.snapshot")

FORMAT = 1


@dataclass(frozen=True)
class Snapshot:
    workspace: str
    version: int
    items: Items
    saved_at: float


def snapshot_path(data_dir: Path, workspace: str) -> Path:
    return Path(data_dir) / f"bridge-snapshot-{workspace}.json"


def write_snapshot(path: Path, workspace: str, version: int, items: Items) -> None:
    body = {
        "format": FORMAT,
        "workspace": workspace,
        "version": version,
        "saved-at": time.time(),
        "items": {t: dict(sorted(items.get(t, {}).items())) for t in TYPES},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(body, indent=1, sort_keys=True))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_snapshot(path: Path, workspace: str) -> Snapshot | None:
    """The snapshot at `path`, or None if there is none or it cannot be used (logged)."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("snapshot.unreadable", path=str(path), error=str(exc))
        return None
    try:
        if body.get("format") != FORMAT or body.get("workspace") != workspace:
            raise ValueError(f"format {body.get('format')!r} / workspace {body.get('workspace')!r} is not ours")
        items = {t: {str(k): str(v) for k, v in body["items"].get(t, {}).items()} for t in TYPES}
        return Snapshot(workspace, int(body["version"]), items, float(body.get("saved-at", 0.0)))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        log.warning("snapshot.unusable", path=str(path), error=str(exc))
        return None

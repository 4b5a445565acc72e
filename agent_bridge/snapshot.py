"""The last-known-good snapshot: what lets an agent start while the config store is down.

Written after every version the `ToolSet` applies from the store, as one JSON
file replaced atomically (write a temporary file, fsync, rename), so a crash
mid-write leaves the previous snapshot, never half of one.

A snapshot is bound to the deployment it was taken from: the broker the
bridge reached and the topicspace, as well as the workspace. Its file is
named after all three and records them, and one is read back only by a
bridge of the same deployment. A data directory shared by agents of several
deployments (the default `./.toolreg` is shared by everything run from one
directory) must never answer a call aimed at one deployment with the tools of
another: a snapshot's items name their queues in full, so the call would
reach the other deployment's service and succeed there.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from toolservice_base.logs import get_logger

from .build import TYPES, Items

log = get_logger("agent_bridge.snapshot")

FORMAT = 2
"""2: bound to a deployment (`broker`, `topicspace`). A format-1 file (workspace only) is never read."""
PREFIX = "bridge-snapshot-"


@dataclass(frozen=True)
class Deployment:
    """Where a bridge's tools come from: the broker it reaches and the topicspace its topics live in."""

    broker: str
    topicspace: str

    @classmethod
    def of(cls, broker_url: str, topicspace: str) -> Deployment:
        return cls(_normalised(broker_url), topicspace)

    @property
    def tag(self) -> str:
        """A short digest of the broker and topicspace: what tells two deployments' files apart by name."""
        return hashlib.sha256(f"{self.broker}\n{self.topicspace}".encode()).hexdigest()[:10]

    def __str__(self) -> str:
        return f"topicspace {self.topicspace} on {self.broker}"


def _normalised(url: str) -> str:
    """One spelling per broker address: scheme and hosts lower-cased, a host list sorted, no trailing slash."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        return url.strip()
    hosts = sorted(part.strip().lower() for part in rest.rstrip("/").split(","))
    return f"{scheme.lower()}://{','.join(hosts)}"


@dataclass(frozen=True)
class Snapshot:
    workspace: str
    version: int
    items: Items
    saved_at: float
    deployment: Deployment
    path: Path

    def describe(self, now: float | None = None) -> str:
        """Which snapshot, how old, from where: what a user must be told when tools come from it."""
        age = max(0.0, (time.time() if now is None else now) - self.saved_at)
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.saved_at))
        return (
            f"the snapshot {self.path} of workspace {self.workspace!r} ({self.deployment}), taken {_age(age)} ago"
            f" ({taken}) at config version {self.version}"
        )


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def snapshot_path(data_dir: Path, workspace: str, deployment: Deployment) -> Path:
    return Path(data_dir) / f"{PREFIX}{workspace}.{deployment.topicspace}.{deployment.tag}.json"


def write_snapshot(path: Path, deployment: Deployment, workspace: str, version: int, items: Items) -> None:
    body = {
        "format": FORMAT,
        "broker": deployment.broker,
        "topicspace": deployment.topicspace,
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


def read_snapshot(path: Path, deployment: Deployment, workspace: str) -> Snapshot | None:
    """The snapshot at `path` if it is of `deployment` and `workspace`; None if there is none, or it cannot be used
    (logged): another deployment's snapshot is never used."""
    snapshot = _read(path)
    if snapshot is None:
        return None
    if snapshot.deployment != deployment or snapshot.workspace != workspace:
        log.warning(
            "snapshot.other_deployment",
            path=str(path),
            taken_from=str(snapshot.deployment),
            workspace=snapshot.workspace,
            wanted=str(deployment),
        )
        return None
    return snapshot


def other_snapshots(data_dir: Path, workspace: str, deployment: Deployment) -> list[Snapshot]:
    """The snapshots of `workspace` in `data_dir` taken from other deployments: what a bridge must not use, and says
    it does not."""
    found = []
    for path in sorted(Path(data_dir).glob(f"{PREFIX}{workspace}.*.json")):
        snapshot = _read(path, quiet=True)
        if snapshot is not None and snapshot.workspace == workspace and snapshot.deployment != deployment:
            found.append(snapshot)
    return found


def _read(path: Path, *, quiet: bool = False) -> Snapshot | None:
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        if not quiet:
            log.warning("snapshot.unreadable", path=str(path), error=str(exc))
        return None
    try:
        if body.get("format") != FORMAT:
            raise ValueError(f"format {body.get('format')!r} is not {FORMAT}")
        items = {t: {str(k): str(v) for k, v in body["items"].get(t, {}).items()} for t in TYPES}
        return Snapshot(
            workspace=str(body["workspace"]),
            version=int(body["version"]),
            items=items,
            saved_at=float(body.get("saved-at", 0.0)),
            deployment=Deployment(str(body["broker"]), str(body["topicspace"])),
            path=path,
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        if not quiet:
            log.warning("snapshot.unusable", path=str(path), error=str(exc))
        return None

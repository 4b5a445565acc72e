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

Beside the whole file, a journal (`.journal`) to which each change the set
follows by delta is appended as one line: the version it starts from, the
version it makes, and the changed items (null: deleted). So a change costs
what changed, not a rewrite of every tool; once the journal outgrows the
whole file, the whole file is written again and the journal emptied. Reading
takes the whole file and then each journal line that follows on from the
version reached, stopping at the first that does not (a line cut short by a
crash, or one left from before the whole file was last written): what is
read is always a set the store really held, the latest one written.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from toolservice_base.logs import get_logger

from .build import TYPES, Items, Touched

log = get_logger("agent_bridge.snapshot")

FORMAT = 2
"""2: bound to a deployment (`broker`, `topicspace`). A format-1 file (workspace only) is never read."""
PREFIX = "bridge-snapshot-"
MIN_JOURNAL_BYTES = 64 * 1024
"""The journal is folded into the whole file once it is larger than that file, and at least this large."""


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


def journal_path(path: Path) -> Path:
    return path.with_name(path.name + ".journal")


def write_snapshot(path: Path, deployment: Deployment, workspace: str, version: int, items: Items) -> int:
    """Write the whole set and empty the journal; returns the whole file's size."""
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
    text = json.dumps(body, indent=1, sort_keys=True)
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    journal_path(path).unlink(missing_ok=True)  # its lines start below the new version: never read again anyway
    return len(text)


def append_change(path: Path, since: int, version: int, changed: Mapping[str, Mapping[str, str | None]]) -> int:
    """Append one change to the journal (flushed, not fsynced: a line lost in a crash leaves the previous version);
    returns the bytes written."""
    line = json.dumps({"since": since, "version": version, "items": changed}, separators=(",", ":")) + "\n"
    with open(journal_path(path), "a", encoding="utf-8") as handle:
        handle.write(line)
    return len(line)


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
        workspace, version = str(body["workspace"]), int(body["version"])
        saved_at, deployment = (
            float(body.get("saved-at", 0.0)),
            Deployment(str(body["broker"]), str(body["topicspace"])),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        if not quiet:
            log.warning("snapshot.unusable", path=str(path), error=str(exc))
        return None
    version = _replay(journal_path(path), version, items)
    return Snapshot(
        workspace=workspace, version=version, items=items, saved_at=saved_at, deployment=deployment, path=path
    )


def _replay(journal: Path, version: int, items: dict[str, dict[str, str]]) -> int:
    """Apply the journal's lines that follow on from `version` to `items`; the version reached."""
    try:
        lines = journal.read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, UnicodeDecodeError):
        return version
    except OSError as exc:
        log.warning("snapshot.journal_unreadable", path=str(journal), error=str(exc))
        return version
    for line in lines:
        try:
            entry = json.loads(line)
            since, reached, changed = int(entry["since"]), int(entry["version"]), entry["items"]
            updates = [(str(t), str(k), v) for t, keys in changed.items() for k, v in keys.items()]
        except (AttributeError, KeyError, TypeError, ValueError):
            break  # cut short by a crash: what came before stands
        if reached <= version:
            continue  # older than the whole file
        if since != version or any(v is not None and not isinstance(v, str) for _, _, v in updates):
            break
        for item_type, key, value in updates:
            if item_type not in items:
                continue
            if value is None:
                items[item_type].pop(key, None)
            else:
                items[item_type][key] = value
        version = reached
    return version


class SnapshotWriter:
    """Keeps one workspace's snapshot current, in order, off the event loop: a change by delta is one journal line,
    any other a whole write; the journal is folded in once it outgrows the whole file."""

    def __init__(self, path: Path, deployment: Deployment, workspace: str) -> None:
        self.path = path
        self.deployment = deployment
        self.workspace = workspace
        self._jobs: deque[tuple[int, int, Items, Touched | None]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._whole_bytes = 0
        self._journal_bytes = 0
        self._written: int | None = None
        """The version the files hold (None: not known to be ours yet: the next write is whole)."""

    def save(self, since: int, version: int, items: Items, touched: Touched | None) -> None:
        """Have the set at `version` written; `touched`: the keys that changed since `since`, if that is all."""
        self._jobs.append((since, version, items, touched))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="toolset-snapshot")

    async def close(self) -> None:
        """Return once every change saved so far is written."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        while self._jobs:
            since, version, items, touched = self._jobs.popleft()
            whole = (
                touched is None
                or self._written != since
                or self._journal_bytes > max(self._whole_bytes, MIN_JOURNAL_BYTES)
            )
            try:
                if whole:
                    self._whole_bytes = await asyncio.to_thread(
                        write_snapshot, self.path, self.deployment, self.workspace, version, items
                    )
                    self._journal_bytes = 0
                else:
                    assert touched is not None
                    changed = {t: {k: items[t].get(k) for k in keys} for t, keys in touched.items() if keys}
                    self._journal_bytes += await asyncio.to_thread(append_change, self.path, since, version, changed)
                self._written = version
            except OSError as exc:
                self._written = None
                log.warning("snapshot.write_failed", path=str(self.path), error=str(exc))

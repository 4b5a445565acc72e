"""The upkeep of a store's file while it serves: that it can still write, its marker current, a backup when one is due.

A store with a file (`ConfigStore.durable`) runs this as one background task
beside the request path, which it never holds up: a tick a `mark_interval`.
The marker lets a store killed with -9 be checked against the file it left
(at most one tick behind); the backups are what `toolreg store restore` and
the advice of a damaged store point at. Nothing is written while the store
cannot write (`writability`, or damage the request path found), and a backup
that fails is tried again after `backup_interval`, not on every tick. The
replicated store has no file, and so no upkeep: its log is its copy.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable

from discovery.disk_access import AccessProblem
from toolservice_base.logs import get_logger

from . import backup as store_backup
from .check import StoreAccessError, StoreDamaged, access_problem
from .sqlite import ConfigStore
from .writability import Writability

log = get_logger("discovery.store")

BackupError = OSError | sqlite3.Error | StoreDamaged | StoreAccessError
"""What taking a backup may raise: logged with its cause and fix, never served (`Upkeep._backup_failed`)."""


class Upkeep:
    """Watch that `store` can write, keep its marker current and take its backups; `run()` until cancelled.

    `damaged` says whether the request path found the file damaged (then
    nothing is touched); `store_failed` is how a failed SQLite call is told
    (the request path's own, so damage found here is served as damage too).
    """

    def __init__(
        self,
        store: ConfigStore,
        writability: Writability,
        *,
        damaged: Callable[[], str | None],
        store_failed: Callable[[str, sqlite3.Error], str],
        mark_interval: float = 1.0,
        backup_interval: float = store_backup.INTERVAL,
        backup_versions: int = store_backup.MAX_VERSIONS,
        backup_keep: int = store_backup.KEEP,
    ) -> None:
        """Backups: at start, then once the store changed and `backup_interval` seconds or `backup_versions` versions
        passed; the newest `backup_keep` are kept."""
        self.store = store
        self.writability = writability
        self._damaged = damaged
        self._store_failed = store_failed
        self.mark_interval = mark_interval
        self.backup_interval = backup_interval
        self.backup_versions = backup_versions
        self.backup_keep = backup_keep
        self.last_backup: store_backup.Backup | None = None
        self._backed_up: int | None = None
        """The version of the newest backup there is (None: none yet, so one is due at once)."""
        self._backed_up_at = float("-inf")
        self._failed_at = float("-inf")

    async def run(self) -> None:
        newest = store_backup.backups_of(self.store.path)  # as the store starts serving: a backup at hand counts
        self._backed_up = store_backup.version_of_backup(newest[-1]) if newest else None
        self._backed_up_at = time.monotonic() if self._backed_up is not None else float("-inf")
        while True:
            try:
                if self._damaged() is None:
                    await self.writability.check()
                if self._damaged() is None and self.writability.reason is None and self._marked():
                    await self._back_up_if_due()
            except sqlite3.Error as exc:
                self._store_failed("keep its marker", exc)
            await asyncio.sleep(self.mark_interval)

    async def _back_up_if_due(self) -> None:
        """A backup when the store changed since the last one and enough time or versions passed (not within
        `backup_interval` of a failed one)."""
        version = self.store.version
        now = time.monotonic()
        if version <= 0 or version == self._backed_up or now - self._failed_at < self.backup_interval:
            return
        if not (
            now - self._backed_up_at >= self.backup_interval
            or self._backed_up is None
            or abs(version - self._backed_up) >= self.backup_versions
        ):
            return
        self._backed_up_at = now
        try:
            self._backed_up = await self._backup()
        except (OSError, sqlite3.Error, StoreDamaged, StoreAccessError) as exc:
            self._failed_at = time.monotonic()
            self._backup_failed(exc)

    def _marked(self) -> bool:
        """Keep the marker current; False if the file system refused it (the store cannot write, and says so)."""
        try:
            self.store.mark()
        except OSError as exc:
            problem = access_problem(exc, self.store.path)
            if problem is not None:
                self.writability.refused(problem, "keep its marker", str(exc))
            else:
                log.error("config.marker_failed", path=str(self.store.path), error=str(exc))
            return False
        return True

    def _backup_failed(self, exc: BackupError) -> None:
        """A backup is a whole copy: a disk too full for it may still take the store's writes, so it is logged, not
        served."""
        if isinstance(exc, StoreAccessError):
            problem: AccessProblem | None = exc.problem
        else:
            problem = None if isinstance(exc, StoreDamaged) else access_problem(exc, self.store.path)
        if problem is None:
            log.error("config.backup_failed", path=str(self.store.path), error=str(exc))
            return
        log.error(
            "config.backup_failed",
            path=str(self.store.path),
            error=str(exc),
            cause=problem.cause,
            fix=f"{problem.remedy(running=True)}; the next backup is tried in {self.backup_interval:g}s",
        )

    async def _backup(self) -> int:
        backup = await asyncio.to_thread(store_backup.take_backup, self.store.path)
        pruned = store_backup.prune(self.store.path, self.backup_keep)
        self.last_backup = backup
        log.info(
            "config.backup_taken",
            path=str(backup.path),
            version=backup.facts.version,
            items=backup.facts.items,
            ms=round(backup.seconds * 1000, 1),
            pruned=len(pruned),
        )
        return backup.facts.version

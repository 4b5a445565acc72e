"""Can the store write now? Followed while it serves, for `/readyz` and for the answer every refused writer gets.

A read-only remount or a full disk does not stop reads, so a store that
only reads its file looks healthy while every write fails. This watches the
file system itself: every second a cheap look (`quick_check`), a real probe
only when it looks read-only or nearly full, or once a write was refused.
It clears by itself, so no one has to restart anything once space is freed
or the mount fixed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from discovery.disk_access import PROBE_BYTES, AccessProblem, free_bytes, probe, quick_check
from toolservice_base.logs import get_logger

from .check import store_files

log = get_logger("discovery.store")


class Writability:
    """Whether the store at `db_path` can write, and if not, why (one line, with the fix)."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.reason: str | None = None
        """Why the store cannot write now; None while it can."""
        self._free_when_full: int | None = None

    def refused(self, problem: AccessProblem, operation: str, error: str = "") -> str:
        """A write was refused for `problem`: not writable until it clears. Logged once, when it starts; returns the
        line to answer."""
        message = problem.says("the config store", running=True)
        if self.reason is None:
            log.error(
                "config.store_unwritable",
                path=str(problem.path),
                cause=problem.cause,
                operation=operation,
                error=error,
                fix=problem.remedy(running=True),
            )
        self.reason = message
        if problem.full:
            self._free_when_full = free_bytes(self.db_path.parent)
        return message

    def wrote(self, how: str) -> None:
        """Something was written after all: writable again."""
        if self.reason is None:
            return
        log.info("config.store_writable", path=str(self.db_path), how=how, was=self.reason)
        self.reason = None
        self._free_when_full = None

    async def check(self) -> None:
        """Look at the file system now (off the event loop) and follow what it says."""
        problem, recovered = await asyncio.to_thread(self._look)
        if problem is not None:
            self.refused(problem, "keep writing")
        elif recovered:
            self.wrote("the file system takes writes again")

    def _look(self) -> tuple[AccessProblem | None, bool]:
        """The problem found now, and whether a store that could not write may be said to write again.

        After a full disk, a probe's page fitting is not enough (SQLite may
        need more than a page): there must be more free space than when the
        write was refused, or a write must succeed (`wrote`).
        """
        directory, files = self.db_path.parent, store_files(self.db_path)
        if self.reason is None:
            return quick_check(directory, files), False
        problem = probe(directory, files)
        if problem is not None:
            return problem, False
        free, before = free_bytes(directory), self._free_when_full
        return None, before is None or free is None or free >= before + PROBE_BYTES

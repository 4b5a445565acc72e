"""Why a directory cannot be written: a read-only mount, a permission, a full disk. Not damage.

The store and the embedded broker keep their data in the data directory.
When the file system refuses a write, SQLite and RocksDB say so in their own
words ("unable to open database file", "disk I/O error", or nothing at all
when the broker's log is on the same full disk), which reads like a damaged
store; restoring a backup then would roll back every write since. So a
failure is checked against the file system itself (`probe`), and what it
finds is said in one line naming the cause and the fix (`AccessProblem.says`).
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROBE_BYTES = 4096
"""What a probe writes: one page, as the smallest write SQLite makes; an empty file costs no space on some file
systems."""
LOW_SPACE = 64 * 1024
"""Below this many free bytes, `quick_check` confirms with a real write whether the disk is full."""
ACCESS_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


@dataclass(frozen=True)
class AccessProblem:
    """The file system refused a write at `path` with `code` (an errno): a problem of the machine, not of the data."""

    code: int
    path: Path

    @property
    def full(self) -> bool:
        return self.code in FULL_ERRNOS

    @property
    def cause(self) -> str:
        """`read-only file system`, `no space left on device`, `permission denied`, ..."""
        text = os.strerror(self.code)
        return text[:1].lower() + text[1:]

    def remedy(self, *, running: bool = False) -> str:
        """What to do, and what not to: the data is whole, so a backup must not be restored over it."""
        then = "writes resume by themselves" if running else "then try again"
        if self.full:
            return f"the disk is full, not damaged: free space on it, {then}; do not restore a backup"
        return (
            f"a permission or mount problem, not damage: fix the mount or permissions, {then}; do not restore a backup"
        )

    def says(self, what: str, *, verb: str = "write", running: bool = False) -> str:
        """The one line: `cannot write the config store at DIR: read-only file system (...)`."""
        return f"cannot {verb} {what} at {self.path}: {self.cause} ({self.remedy(running=running)})"


def of_os_error(exc: BaseException, directory: Path | None = None) -> AccessProblem | None:
    """The access problem an `OSError` reports, if it is one (EIO and the like are not: they may be a failing disk).

    A read-only mount or a full disk is said of `directory` (the place the
    operator fixes); a permission, of the very file refused, when it is known.
    """
    if not isinstance(exc, OSError) or exc.errno not in ACCESS_ERRNOS:
        return None
    named = Path(exc.filename) if isinstance(exc.filename, str) else None
    if exc.errno in (errno.EACCES, errno.EPERM) and named is not None:
        return AccessProblem(exc.errno, named)
    return AccessProblem(exc.errno, directory or named or Path("."))


def _refused(exc: OSError, where: Path) -> AccessProblem | None:
    """`exc` said of `where` (never of the probe's own scratch file)."""
    return AccessProblem(exc.errno, where) if exc.errno in ACCESS_ERRNOS else None


def probe(directory: Path, files: Iterable[Path] = ()) -> AccessProblem | None:
    """Write (and remove) one page in `directory`, and check each existing file of `files` may be written; None if all
    of it works.

    Root is not stopped by permission bits, so writing is the only test that
    tells the truth for every user: it does what the store would do. The
    files themselves are only asked about (`os.access`), never opened: a
    process that closes any descriptor of a SQLite file drops every lock
    SQLite holds on it, and the store may be open in this very process.
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return AccessProblem(errno.EROFS, directory)
    except OSError as exc:
        return _refused(exc, directory)
    target = directory / f".write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        handle = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError as exc:
        return _refused(exc, directory)
    try:
        os.write(handle, b"\0" * PROBE_BYTES)
        os.fsync(handle)
    except OSError as exc:
        return _refused(exc, directory)
    finally:
        os.close(handle)
        try:
            target.unlink()
        except OSError:
            pass
    for path in files:
        if os.path.exists(path) and not os.access(path, os.W_OK):
            return AccessProblem(errno.EACCES, Path(path))
    return None


def free_bytes(directory: Path) -> int | None:
    """Bytes an unprivileged writer may still use in `directory`'s file system; None if it cannot be asked."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def quick_check(directory: Path, files: Iterable[Path] = ()) -> AccessProblem | None:
    """`probe`, but only when the file system looks read-only or nearly full: cheap enough to run every second."""
    try:
        stat = os.statvfs(directory)
    except OSError as exc:
        return _refused(exc, Path(directory))
    if stat.f_flag & os.ST_RDONLY:
        return AccessProblem(errno.EROFS, Path(directory))
    if stat.f_bavail * stat.f_frsize < LOW_SPACE:
        return probe(directory, files)
    return None

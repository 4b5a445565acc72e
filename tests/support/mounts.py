"""Small file systems of our own for a test: a tmpfs that can be filled up or remounted read-only.

Permission bits do not stop root, so a read-only directory and a full disk
are made the way they happen on a machine: a read-only mount, a small file
system filled to the last byte. Mounting needs root (CAP_SYS_ADMIN); without
it the test is skipped, saying so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

FILLER = ".filler"


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "2m") -> Iterator[Path]:
    """Mount a tmpfs of `size` on `path` (made if missing) for the block; always unmounted after, even if it is busy."""
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no `mount` command: cannot make a small or read-only file system for this test")
    done = _mount("-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root (CAP_SYS_ADMIN), which this run does not have: {done.stderr.strip()}")
    try:
        yield path
    finally:
        _mount("-o", "remount,rw", str(path))  # a read-only mount left by a failed test
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(
                ["umount", "-l", str(path)], capture_output=True, timeout=30
            )  # busy: detach it now, freed once closed


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """Remount the tmpfs at `path` read-only for the block (nothing may hold a file open for writing in it), then
    read-write."""
    done = _mount("-o", "remount,ro", str(path))
    assert done.returncode == 0, f"cannot remount {path} read-only: {done.stderr.strip()}"
    try:
        yield path
    finally:
        _mount("-o", "remount,rw", str(path))


def fill(path: Path, leave: int = 0) -> int:
    """Fill the file system of `path` (a file named `FILLER`) to the last byte, then give back `leave` bytes; returns
    the bytes taken."""
    written = 0
    block = b"\0" * 4096
    with open(path / FILLER, "ab", buffering=0) as handle:
        for chunk in (block, b"\0" * 512, b"\0"):  # pages first, then whatever is left of the last one
            while True:
                try:
                    written += handle.write(chunk) or 0
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    if leave:
        os.truncate(path / FILLER, max(0, written - leave))
        written = max(0, written - leave)
    return written


def free(path: Path) -> None:
    """Give back the space `fill` took."""
    (path / FILLER).unlink(missing_ok=True)


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize

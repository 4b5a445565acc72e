"""What every `toolreg` command shares: one-line failures, settings, signals, lazily loaded handlers.

Nothing here imports a subsystem: `toolreg trust list` must not load the
registry, the store or the web stack.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import gc
import importlib
import math
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from discovery.store.settings import StoreSettings
from toolservice_base import Settings, ToolDiscoveryError, Transport, open_transport
from toolservice_base.transport import broker_unreachable


class CommandError(ToolDiscoveryError):
    """A failure the user can fix; printed as one line, exit code 1."""


def fail(message: str) -> int:
    print(f"toolreg: {message}", file=sys.stderr)
    return 1


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings.from_env(data_dir=getattr(args, "data_dir", None), topicspace=getattr(args, "topicspace", None))


NOTICE_AFTER = 1.0
"""Seconds a command waits in silence before it says, on a terminal, what it is waiting for."""


@contextlib.contextmanager
def waiting_for(what: str, after: float = NOTICE_AFTER) -> Iterator[None]:
    """On a terminal, say on stderr what the command is waiting for once the wait has lasted `after` seconds.

    Off a terminal (a pipe, a log, a test) nothing is said: the outcome's own
    line is enough there.
    """
    if not sys.stderr.isatty():
        yield
        return
    handle = asyncio.get_running_loop().call_later(
        after, lambda: print(f"toolreg: waiting for {what}...", file=sys.stderr, flush=True)
    )
    try:
        yield
    finally:
        handle.cancel()


class Deadline:
    """A command's `--timeout`: one budget for connecting to the broker and waiting for the answer."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def left(self, floor: float = 0.1) -> float:
        """Seconds left, but never less than `floor`: a step that has begun gets a moment to answer."""
        return max(floor, self._end - time.monotonic())


async def connect(args: argparse.Namespace, deadline: Deadline) -> Transport:
    """The broker connection of a command with a `--timeout`: fails in one line within it when the broker is not there.

    pulsar-client would retry an absent broker for its whole operation timeout
    (10 s), so the broker's address is tried first, within the deadline, and
    every broker operation after is bounded by what is left of it.
    """
    settings = settings_of(args)
    url = settings.resolve_pulsar_url()
    with waiting_for(f"the broker at {url}"):
        reason = await broker_unreachable(url, deadline.left())
    if reason is not None:
        raise CommandError(reason)
    bounded = dataclasses.replace(settings, operation_timeout=max(1, math.ceil(deadline.left())))
    return await open_transport(bounded, url=url)


async def opened(start: Awaitable[Any], url: str, queues: str, deadline: Deadline) -> None:
    """Await `start` (a client subscribing and opening producers) within the deadline, or fail in one line.

    pulsar-client gives a broker that accepts TCP but never answers its own
    connection timeout (5 s) before the operation timeout starts; the deadline
    is the user's, so it is kept here.
    """
    with waiting_for(f"the broker at {url} (opening {queues})"):
        try:
            async with asyncio.timeout(deadline.left()):
                await start
        except TimeoutError:
            raise CommandError(
                f"the broker at {url} accepts connections but did not open {queues} within {deadline.seconds:g}s; "
                "is it a Pulsar broker, and is it overloaded or refusing our token (PULSAR_AUTH_TOKEN)?"
            ) from None


YOUNG_COLLECTION_THRESHOLD = 10_000
"""Net new container objects between two collections of the youngest generation (Python's default is 700)."""


def settle_heap() -> None:
    """Once a long-running command serves: what its start built (imported modules, the MCP SDK and pydantic's
    validators, connections) lives as long as the process, so it is moved out of the cyclic collector's reach,
    and the youngest generation is collected less often.

    Why the freeze: a full collection otherwise walks those ~100,000 objects each time, 60 to 90 ms during which
    nothing is served, several times a minute under load (measured in `toolreg announce --mcp`, where after this a
    full collection takes under 1 ms). What becomes garbage after this is collected as before.

    Why the threshold: with Python's 700, the MCP front over HTTP at 32 calls in flight collected its youngest
    generation every 4 calls or so; each time, the objects of the calls still in flight were walked and moved up a
    generation, walked again there, and again in the full collections they set off (1,053 / 95 / 9 collections,
    0.69 s over a 4,600-call run). At `YOUNG_COLLECTION_THRESHOLD` most of a call's objects are freed by their
    count before any collection sees them: 29 / 3 / 1 collections, 0.27 s, for the same run (each young
    collection is then a few milliseconds; the full ones they replace took 20 to 30). Cyclic garbage waits at
    most that many objects longer.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])


async def wait_for_signal(*watched: asyncio.Future[Any]) -> None:
    """Return on the first SIGTERM or SIGINT (Ctrl-C), or raise what a `watched` task raised if one ends first.

    A watched task is one the command cannot run without (the broker's
    supervisor): when it gives up, the command stops with its error.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({stopping, *watched}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopping:
                task.result()  # raises what ended it
    finally:
        stopping.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


class UpLock:
    """One `toolreg up` per data directory: a second would run a second registry."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / "up.lock"
        self._file = open(self.path, "a+")

    def acquire(self, what_to_do: str = "stop it or use another --data-dir") -> None:
        """Hold the lock (and write our pid in it), or fail in one line ending with `what_to_do`."""
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            pid = self._file.read().strip() or "?"
            raise CommandError(
                f"`toolreg up` is already running for {self.path.parent} (pid {pid}); {what_to_do}"
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(str(os.getpid()))
        self._file.flush()

    def release(self) -> None:
        self._file.close()


Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def lazy(module: str, name: str) -> Handler:
    """A command's handler, imported from `discovery.cli.<module>` only when that command runs.

    The parser names every command, but building it loads no subsystem: each
    command pays only for what it uses.
    """

    async def handler(args: argparse.Namespace) -> int:
        target: Handler = getattr(importlib.import_module(f"discovery.cli.{module}"), name)
        return await target(args)

    handler.__qualname__ = f"lazy({module}.{name})"
    return handler


STORES = ("sqlite", "pulsar")
"""The config store's backends (`--store`, TOOLREG_STORE)."""


def store_choice(args: argparse.Namespace) -> str:
    """`--store`, else TOOLREG_STORE, else sqlite; one line for anything else. `up` and `store export|import` share
    it."""
    chosen = getattr(args, "store", None) or StoreSettings.variable("backend").read() or "sqlite"
    if chosen not in STORES:
        raise CommandError(f"{StoreSettings.env('backend')}={chosen!r} is not a store; use one of: {', '.join(STORES)}")
    return str(chosen)

"""Keep the embedded broker running: notice it died, start it again on the same port and data.

Every service, agent and command on the machine keeps the broker URL it
started with, and pulsar-client reconnects to that URL by itself. So the
supervisor's whole job is to bring a broker back *there*, quickly: the first
restart is immediate (a crashed pulsar-lite is back in about 30 ms), later
ones back off, and a broker that cannot be kept alive ends the supervision
with one line saying why, instead of a registry running on without a broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import NoReturn, TypeVar

from discovery.errors import BrokerError
from toolservice_base.logs import get_logger
from toolservice_base.tasks import cancel_and_wait

from .embedded import EmbeddedBroker

log = get_logger("discovery.broker")

T = TypeVar("T")

RESTART_DELAYS = (0.0, 0.5, 1.0, 2.0, 4.0)
"""Seconds to wait before each restart attempt in a row; after the last fails, give up (~7.5 s of trying)."""
MAX_DEATHS = 5
DEATH_WINDOW = 60.0
"""More than `MAX_DEATHS` deaths within `DEATH_WINDOW` seconds is a crash loop: give up rather than spin."""


class BrokerSupervisor:
    """Watch one `EmbeddedBroker` (started or adopted) and restart it when its process dies.

    `run()` returns only by raising `BrokerError` when it gives up; cancel it
    to stop supervising (before stopping the broker, or it would be restarted).
    """

    def __init__(
        self,
        broker: EmbeddedBroker,
        *,
        poll_interval: float = 0.1,
        delays: tuple[float, ...] = RESTART_DELAYS,
        max_deaths: int = MAX_DEATHS,
        window: float = DEATH_WINDOW,
        start_timeout: float = 10.0,
    ) -> None:
        self.broker = broker
        self.poll_interval = poll_interval
        self.delays = delays
        self.max_deaths = max_deaths
        self.window = window
        self.start_timeout = start_timeout
        self.restarts = 0
        self.last_downtime: float | None = None
        """Seconds from noticing the last death to the broker accepting connections again."""
        self.down_since: float | None = None
        self._deaths: deque[float] = deque()

    def readiness(self) -> str | None:
        """None while the broker runs; else since when it is down. For `/readyz`."""
        if self.down_since is None:
            return None
        return f"embedded broker down for {time.monotonic() - self.down_since:.1f}s; restarting it"

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[asyncio.Task[NoReturn]]:
        """Supervise while the block runs; the task, to watch for giving up, is what it yields."""
        task = asyncio.create_task(self.run(), name="broker-supervisor")
        try:
            yield task
        finally:
            await cancel_and_wait(task)  # still watching or given up: over either way (the watcher reads a give-up)

    async def run(self) -> NoReturn:
        while True:
            await self._until_dead()
            await self._recover()

    async def _until_dead(self) -> None:
        """Return when the broker's process has ended: at once through a pidfd, else by polling."""
        pid = self.broker.pid
        if pid is None or not self.broker.alive():
            return
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # not Linux >= 5.3, or already gone
            pidfd = None
        if pidfd is None:
            while True:
                await asyncio.sleep(self.poll_interval)
                if not self.broker.alive():
                    return
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def on_exit() -> None:
            if not ended.done():
                ended.set_result(None)

        loop.add_reader(pidfd, on_exit)
        try:
            await ended
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        self.broker.alive()  # the pidfd is readable once the process has ended; this reaps our child

    async def _recover(self) -> None:
        broker = self.broker
        died = self.down_since = time.monotonic()
        self._deaths.append(died)
        while self._deaths and died - self._deaths[0] > self.window:
            self._deaths.popleft()
        status = broker.exit_status
        log.warning("broker.died", url=broker.url, status=status, deaths_in_window=len(self._deaths))
        if len(self._deaths) > self.max_deaths:
            raise BrokerError(
                f"the embedded broker at {broker.url} died {len(self._deaths)} times within {self.window:g}s "
                f"(last: {status}); see {broker.log_file}, fix the cause and run `toolreg up` again"
            )
        # A broker that died again soon after a restart starts further along the back-off.
        first = len(self._deaths) - 1
        last_error: BrokerError | None = None
        for attempt in range(1, len(self.delays) + 1):
            delay = self.delays[min(first + attempt - 1, len(self.delays) - 1)]
            if delay:
                await asyncio.sleep(delay)
            try:
                url = await self._in_thread(lambda: broker.restart(self.start_timeout))
            except BrokerError as exc:
                last_error = exc
                log.warning("broker.restart_failed", url=broker.url, attempt=attempt, error=str(exc))
                continue
            self.last_downtime = time.monotonic() - died
            self.restarts += 1
            self.down_since = None
            log.info(
                "broker.restarted",
                url=url,
                pid=broker.pid,
                attempt=attempt,
                downtime_ms=round(self.last_downtime * 1000, 1),
                restarts=self.restarts,
            )
            return
        raise BrokerError(
            f"the embedded broker at {broker.url} died ({status}) and could not be restarted in "
            f"{time.monotonic() - died:.1f}s: {last_error}; see {broker.log_file}"
        )

    @staticmethod
    async def _in_thread(call: Callable[[], T]) -> T:
        """Run a blocking broker start off the loop; if cancelled meanwhile, let it finish first.

        Otherwise a cancelled supervisor could leave a broker starting behind
        the back of whoever stops the broker next.
        """
        future = asyncio.get_running_loop().run_in_executor(None, call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            try:
                await future
            except Exception:
                pass
            raise

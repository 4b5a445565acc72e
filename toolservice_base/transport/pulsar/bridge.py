"""`LoopBridge`: what pulsar-client's threads finish, handed to the event loop once per batch.

The hot paths run on pulsar-client's own threads: a consumer's `message_listener`
(its listener thread) and a producer's `send_async` callback (an I/O thread).
`pulsar.asyncio` instead crosses from the loop into C++ for every `receive()` and
`send()` and back through `call_soon_threadsafe` for each: measured in
bench/PROFILE.md, 32 % + 12 % of a caller's loop thread went there. Here the
loop is entered only to run Python that must run on it, and completions that
arrive together share one wake-up: the first one posted schedules a drain, the
others join its batch.

Rules for code on pulsar-client's threads, kept by every caller of `post`:
touch no asyncio object (only `post` reaches the loop), do little under the GIL,
and never let an exception escape into the C++ client (it logs and goes on, but
the message would be gone without a word from us).

When the loop is closed under pending completions (an application that ends
its loop without closing the transport), nothing can run on it any more:
`post` says so once, through `on_loop_gone`, which closes the client off the
loop so no thread or connection outlives it; what was pending is dropped.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from ...logs import get_logger

log = get_logger("toolservice_base.transport")


class LoopBridge:
    """A queue of completions from any thread, drained on the event loop's thread in the order they came."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_loop_gone: Callable[[], None]) -> None:
        self._loop = loop
        self._pending: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._scheduled = False
        self._gone = False
        self._on_loop_gone = on_loop_gone

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def post(self, complete: Callable[[Any], None], value: Any) -> None:
        """Run `complete(value)` on the loop soon; safe from any thread, cheap when a drain is already due.

        A drain is scheduled only when none is: the flag is cleared by the drain
        before it takes anything, so an item posted at any moment is either in a
        batch being taken or has a drain of its own coming (at worst one drain too
        many, which finds nothing).
        """
        self._pending.append((complete, value))
        if self._scheduled:
            if self._loop.is_closed():  # closed with a drain still due (it was stopped first): none will run
                self._loop_gone()
            return
        self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nothing will ever run there again
            self._loop_gone()

    def check(self) -> None:
        """From a client thread that posts nothing this time: notice a loop closed under it all the same."""
        if self._loop.is_closed():
            self._loop_gone()

    def _drain(self) -> None:
        self._scheduled = False
        pending = self._pending
        while pending:
            complete, value = pending.popleft()
            try:
                complete(value)
            except Exception:  # one bad completion must not strand the rest of the batch
                log.exception("transport.completion_failed")

    def _loop_gone(self) -> None:
        self._pending.clear()
        if self._gone:
            return
        self._gone = True
        try:
            self._on_loop_gone()
        except Exception:
            log.exception("transport.loop_gone_cleanup_failed")

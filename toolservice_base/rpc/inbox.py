"""`Inbox`: one call's responses on the caller's side, as they arrive, and the call waiting for the next."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from toolservice_base.errors import TransportError


class Inbox:
    """One call's responses as they arrive, and the call waiting for the next.

    Lighter than an `asyncio.Queue` per call (which looks the running loop up on
    every get and put): responses are appended by the subscription's handler and
    wake the one waiter directly. `fail` is the request's send failing after it
    was handed over (`Publisher.send(confirm=False)`): the call raises that.
    """

    __slots__ = ("bodies", "waiter", "failure")

    def __init__(self) -> None:
        self.bodies: deque[dict[str, Any]] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.failure: TransportError | None = None

    def put(self, body: dict[str, Any]) -> None:
        self.bodies.append(body)
        self.wake()

    def fail(self, error: TransportError) -> None:
        self.failure = error
        self.wake()

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, loop: asyncio.AbstractEventLoop) -> None:
        """Until `wake` (no timer: the caller's own wakes it at its deadline)."""
        waiter = self.waiter = loop.create_future()
        try:
            await waiter
        finally:
            self.waiter = None


def time_is_up(waiter: asyncio.Future[None]) -> None:
    """A wait's time is up: the waiter wakes to find nothing new."""
    if not waiter.done():
        waiter.set_result(None)

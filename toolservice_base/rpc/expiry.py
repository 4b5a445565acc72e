"""A request's deadline on the server: `Expiry`, one timer per call that waits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Expiry:
    """A request's deadline: at it, the call is cancelled, and its slot is freed `cancel_grace` later if the handler
    has not let go (as `asyncio.timeout_at` would cancel it, with one timer instead of two).

    Its timer is set (`arm`) once the call waits for something: a call answered within its first step, which
    nothing can interrupt, never needs one."""

    __slots__ = ("_task", "_request_id", "_deadline", "_grace", "_abandon", "_cancelling", "_handle", "_guard", "fired")

    def __init__(
        self,
        task: asyncio.Task[None],
        request_id: str,
        deadline: float,
        grace: float,
        abandon: Callable[[asyncio.Task[None], str], None],
    ) -> None:
        """`abandon(task, request_id)` runs `grace` seconds after the deadline cancelled the call, unless it ended."""
        self._task, self._request_id, self._deadline = task, request_id, deadline
        self._grace, self._abandon = grace, abandon
        self._cancelling = task.cancelling()
        self.fired = False
        self._guard: asyncio.TimerHandle | None = None
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._handle is None:
            self._handle = loop.call_at(self._deadline, self._fire)

    def _fire(self) -> None:
        if self._task.done():
            return
        self.fired = True
        self._task.cancel()
        self._guard = self._task.get_loop().call_later(self._grace, self._abandon, self._task, self._request_id)

    def ended_the_call(self) -> bool:
        """For a call that ended cancelled: whether the deadline did it (and not a cancel from elsewhere too)."""
        return self.fired and self._task.uncancel() <= self._cancelling

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self._guard is not None:
            self._guard.cancel()

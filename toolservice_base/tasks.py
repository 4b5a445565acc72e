"""Small helpers for the background tasks the services and the bridge run."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` and return once it has ended, however it ended.

    Why not just `task.cancel()`: cancelling only asks. The task may still be
    running its `finally` blocks (an unsubscribe, a close) when `cancel()`
    returns, so whoever stops a task must await it before closing what the
    task uses. And awaiting it raises: its `CancelledError`, or its own error
    if it failed before the cancel landed (awaiting also marks that error
    retrieved, so no "exception was never retrieved" warning). Its owner is
    shutting it down, so both are swallowed here.

    Only the task's cancellation is swallowed, not the caller's: if the caller
    is itself cancelled while it waits, that `CancelledError` propagates. One
    that was already pending when the caller got here (a `close()` in the
    cleanup of a cancelled task) does not stop it: the caller finishes its
    cleanup. `None` (no task was started) does nothing.
    """
    if task is None:
        return
    current = asyncio.current_task()
    pending = current.cancelling() if current is not None else 0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > pending:
            raise  # the caller was cancelled while it waited
    except Exception:  # it failed before it was stopped: its outcome no longer matters
        pass

"""Small helpers for the background tasks the services and the bridge run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


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


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Whether `event` was set within `timeout` seconds (`None`: however long it takes).

    Not `asyncio.wait_for(event.wait(), timeout)`: on Python 3.11 that swallows
    a cancellation arriving as the event is set (seen in the replicas: a
    heartbeat loop woken by `set_role` as it was being closed went on for ever).
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def gather_or_raise(*steps: Awaitable[Any]) -> list[Any]:
    """Run `steps` at once; once every one has ended, raise the first failure, if any, else return their results.

    Why not plain `asyncio.gather`: on a failure it returns at once while the
    other steps go on, so a caller that undoes its start (closing what the
    steps open) would race steps still opening things.
    """
    results = await asyncio.gather(*steps, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def close_when_granted(
    opening: asyncio.Future[T], close: Callable[[T], Awaitable[object]], keep: set[asyncio.Future[Any]]
) -> None:
    """Close what `opening` yields once it does: for an open whose caller stopped waiting.

    Why: cancelling a producer, reader or consumer being opened does not
    withdraw the request from the broker; pulsar-client finishes it on its own
    thread, and what it grants then would hold a subscription, an exclusive
    topic or a connection for nobody. So the caller gives up on the *wait*
    (shielding the open), and this closes the grant when it comes. `keep`
    holds the open, then the close, until each has ended: the event loop keeps
    only weak references to tasks, and an owner that shuts down waits on
    `keep` so nothing it opened outlives it. An open that failed or was
    cancelled leaves nothing to close.
    """
    keep.add(opening)

    def granted(done: asyncio.Future[T]) -> None:
        keep.discard(done)
        if done.cancelled() or done.exception() is not None:
            return
        closing = asyncio.ensure_future(close(done.result()))
        keep.add(closing)
        closing.add_done_callback(keep.discard)

    opening.add_done_callback(granted)


def retrieve_outcome(future: asyncio.Future[Any]) -> None:
    """Take `future`'s outcome, so that a failure nobody awaits is not logged by asyncio as never retrieved.

    For a future its caller stopped waiting for on purpose (an attempt
    abandoned, a write whose failure is reported elsewhere): add it as a done
    callback.
    """
    if not future.cancelled():
        future.exception()

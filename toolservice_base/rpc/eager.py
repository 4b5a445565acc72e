"""`start_now`: a task whose first step runs at once, as Python 3.12's eager tasks do.

asyncio runs a new task on the loop's next iteration. A request server makes
a task per request, and most requests (a tool that answers without waiting
for anything) are done within that first step: the iteration in between costs
each of them a turn of the selector, and its answer goes out a turn later.
Started now, such a request is answered before the handler that took it
returns, and a task that is already done needs no tracking at all.

The task is a real task from the start, current while its first step runs
(`asyncio.timeout`, `TaskGroup` and `current_task()` inside a handler work as
they always did), in a context of its own.

Python 3.12 has this as `Task(..., eager_start=True)`. Python 3.11 has no
such flag: the task is created as usual and its first step, which the loop
has just queued as the last of its ready callbacks, is taken off the queue and
run here. Where that cannot be done (a loop other than asyncio's own, such as
uvloop; a task factory that queues something else; another task running at
this moment, which a step cannot interrupt on 3.11), the task starts on the
next iteration, as any task does.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_EAGER_FLAG = sys.version_info >= (3, 12)


def start_now(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task running `coro` whose first step has run by the time this returns (where the loop allows it, see the
    module); check `done()` to know whether it needs anything more."""
    if _EAGER_FLAG:
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
    task = loop.create_task(coro)
    if not isinstance(loop, asyncio.BaseEventLoop) or asyncio.current_task(loop) is not None:
        return task
    ready = getattr(loop, "_ready", None)
    if isinstance(ready, deque) and ready:
        step = ready[-1]
        if getattr(getattr(step, "_callback", None), "__self__", None) is task:
            ready.pop()
            step._run()
    return task


__all__ = ["start_now"]

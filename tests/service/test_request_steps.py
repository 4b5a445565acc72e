"""A request's handling starts the moment it arrives, in a task of its own, and keeps every guarantee a task gives.

The server runs a request's first step at once (`rpc.eager.start_now`): a
handler that answers without waiting has answered before the next message is
taken. What must not change with it: each handler runs in its own task and
context (`asyncio.timeout`, `current_task()`, context variables), and one
that does wait is still ended by its caller's deadline or cancel, its slot
freed for the next request.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support import eventually

from toolservice_base import RequestClient, RequestTimeout, Transport
from toolservice_base.rpc import CallLimits, RequestServer
from toolservice_base.rpc.eager import start_now
from toolservice_base.transport import Envelope

pytestmark = pytest.mark.contract

Reply = Callable[[dict[str, Any]], Awaitable[None]]
SEEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("seen", default=None)


async def test_a_task_started_now_has_taken_its_first_step_when_it_is_returned() -> None:
    steps: list[str] = []

    async def work() -> str:
        steps.append("first")
        await asyncio.sleep(0)
        steps.append("second")
        return "done"

    loop = asyncio.get_running_loop()
    started: asyncio.Future[tuple[asyncio.Task[str], list[str]]] = loop.create_future()

    def start() -> None:  # from a callback, as a subscription's handler runs; what had run as start_now returned
        task = start_now(loop, work())
        started.set_result((task, list(steps)))

    loop.call_soon(start)
    task, when_returned = await started
    assert when_returned == ["first"]
    assert await task == "done" and steps == ["first", "second"]


def _pair(connection: Transport, name: str) -> tuple[str, str]:
    return connection.topics.request_queue(name), connection.topics.response_queue(name)


async def test_each_handler_runs_in_a_task_and_context_of_its_own_from_its_first_step(connection: Transport) -> None:
    tasks: list[asyncio.Task[Any] | None] = []
    leaked: list[str | None] = []

    async def handle(message: Envelope, reply: Reply) -> None:
        tasks.append(asyncio.current_task())
        leaked.append(SEEN.get())
        SEEN.set(message.properties.get("id", "?"))
        async with asyncio.timeout(5):  # needs a current task: it raises without one
            await reply({"echo": json.loads(message.data)["text"]})

    requests, responses = _pair(connection, "rpc-steps")
    async with RequestServer(connection, requests, responses, handle, subscription="rpc-steps") as server:
        async with RequestClient(connection, requests, responses) as client:
            answers = [await client.request({"text": str(n)}, timeout=5) for n in range(3)]
    assert [a["echo"] for a in answers] == ["0", "1", "2"] and server.handled == 3
    assert all(task is not None for task in tasks) and len(set(map(id, tasks))) == 3
    assert leaked == [None, None, None], "a handler's context variable reached the next request's handler"


async def test_a_handler_that_waits_is_still_ended_at_its_callers_deadline_and_its_slot_freed(
    connection: Transport,
) -> None:
    hung: list[str] = []
    cancelled: list[str] = []

    async def handle(message: Envelope, reply: Reply) -> None:
        text = json.loads(message.data)["text"]
        if text == "ping":
            await reply({"echo": "pong"})
            return
        hung.append(text)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(text)
            raise

    requests, responses = _pair(connection, "rpc-steps-deadline")
    server = RequestServer(
        connection, requests, responses, handle, subscription="rpc-steps-deadline", max_in_flight=1, cancellable=True
    )
    async with server, RequestClient(connection, requests, responses) as client:
        with pytest.raises(RequestTimeout):
            await client.request({"text": "hang"}, timeout=0.3)
        await eventually(lambda: cancelled == ["hang"] and server.in_flight == 0)
        assert server.expired == 1
        # The one slot is free again: the next request is answered, not left waiting behind the hung one.
        assert (await client.request({"text": "ping"}, timeout=5))["echo"] == "pong"


async def test_a_handler_that_answered_once_and_waits_is_stopped_by_its_callers_cancel(connection: Transport) -> None:
    cancelled: list[str] = []

    async def handle(message: Envelope, reply: Reply) -> None:
        await reply({"part": 1, "end_of_stream": False})  # sent within the first step
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(message.properties.get("id", ""))
            raise

    requests, responses = _pair(connection, "rpc-steps-cancel")
    server = RequestServer(connection, requests, responses, handle, subscription="rpc-steps-cancel", cancellable=True)
    async with server, RequestClient(connection, requests, responses, cancels=True) as client:
        stream = client.stream(
            {"text": "x"}, is_last=lambda body: body.get("end_of_stream", True), limits=CallLimits(30)
        )
        first = await anext(stream)
        await stream.aclose()  # leaves after the first part: the service is told
        assert first["part"] == 1
        await eventually(lambda: len(cancelled) == 1 and server.in_flight == 0)
        assert server.cancelled == 1 and server.expired == 0

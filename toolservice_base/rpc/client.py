"""The caller's side of request/response: `RequestClient`.

It subscribes to the response queue *before* it sends anything: on a
non-persistent topic a response published before the subscription exists is
gone. Every client has its own exclusive subscription and keeps the responses
whose `id` it issued.

Each client also has a private reply queue, `<response-queue>.<client id>`,
named in every request's `reply-to` property, and our servers answer there.
On the shared queue every client receives every client's answers: N agents
calling one service each received N times the traffic, and another agent's
answer over 64 KiB could cost a call its own answer (see `transport.Capabilities`). A
server that does not know `reply-to` answers on the shared queue, which the
client still reads, so either side may be older than the other.

A call's `timeout` bounds all of it, a stream included, and travels with the
request (`timeout-ms`) so the server stops work nobody waits for. A client
made with `cancels=True` also says so at once when it gives up early (left the
stream, took too much): it publishes the request's id on the service's cancel
queue (`rpc_wire.cancel_queue`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from typing import Any, Self

from pydantic import BaseModel

from toolservice_base.errors import RequestTimeout, TransportError
from toolservice_base.logs import get_logger
from toolservice_base.transport import Envelope, Publisher, Subscription, Transport, unique_name

from .wire import ID, REPLY_TO, TIMEOUT_MS, cancel_queue, private_queue, timeout_ms

log = get_logger("toolservice_base.rpc")

DEFAULT_TIMEOUT = 30.0
READY_INTERVAL = 0.05
READY_ATTEMPTS = 40
CANCEL_CLOSE_WAIT = 1.0


class _Answers:
    """One call's responses as they arrive, and the call waiting for the next.

    Lighter than an `asyncio.Queue` per call (which looks the running loop up on
    every get and put): responses are appended by the subscription's handler and
    wake the one waiter directly.
    """

    __slots__ = ("bodies", "waiter")

    def __init__(self) -> None:
        self.bodies: deque[dict[str, Any]] = deque()
        self.waiter: asyncio.Future[None] | None = None

    def put(self, body: dict[str, Any]) -> None:
        self.bodies.append(body)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _wake(waiter: asyncio.Future[None]) -> None:
    """A wait's time is up: the waiter wakes to find nothing new."""
    if not waiter.done():
        waiter.set_result(None)


class RequestClient:
    """Send requests on one queue and collect their responses from another."""

    def __init__(
        self,
        connection: Transport,
        request_queue: str,
        response_queue: str,
        *,
        name: str = "client",
        bulk: bool = False,
        cancels: bool = False,
    ) -> None:
        """`bulk=True` when responses can exceed 64 KiB (see `Transport.subscribe`); `cancels=True` to send cancels."""
        self.cancel_queue = cancel_queue(request_queue) if cancels else None
        self._cancel_publisher: Publisher | None = None
        self._cancel_lock = asyncio.Lock()
        self._cancelling: set[asyncio.Task[None]] = set()
        self._connection = connection
        self._bulk = bulk
        self.request_queue = request_queue
        self.response_queue = response_queue
        self._name = name
        self._pending: dict[str, _Answers] = {}
        # Request ids: this client's random prefix and a counter. Unique across clients as uuid4 is, without a
        # getrandom() call per request (8 % of a caller's loop thread at 64 calls in flight, measured with py-spy).
        self._id_prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count()
        self._publisher: Publisher | None = None
        self._subscription: Subscription | None = None
        self._private: Subscription | None = None
        self.reply_queue = private_queue(response_queue, uuid.uuid4().hex[:16])
        self._start_lock = asyncio.Lock()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def start(self) -> "RequestClient":
        async with self._start_lock:
            if self._publisher is None:
                # The two subscriptions and the producer are independent: opened at once, a new client costs
                # one broker round trip (a lookup and a create) instead of three.
                queues = [self.response_queue, *([self.reply_queue] if self.reply_queue is not None else [])]
                producing = asyncio.ensure_future(self._connection.publisher(self.request_queue))
                opened: list[Subscription] = []
                try:
                    results = await asyncio.gather(
                        *(
                            self._connection.subscribe(
                                queue, self._on_response, subscription=unique_name(self._name), bulk=self._bulk
                            )
                            for queue in queues
                        ),
                        return_exceptions=True,
                    )
                    opened = [result for result in results if not isinstance(result, BaseException)]
                    publisher = await producing
                    if failure := next((result for result in results if isinstance(result, BaseException)), None):
                        raise failure
                except BaseException:
                    await self._abandon(producing, opened)
                    raise
                self._subscription = opened[0]
                self._private = opened[1] if len(opened) > 1 else None
                if self._connection.capabilities.confirm_subscription_receives:
                    await asyncio.gather(*(self._until_receiving(queue) for queue in queues))
                self._publisher = publisher
        return self

    async def _abandon(self, producing: "asyncio.Future[Publisher]", opened: list[Subscription]) -> None:
        """A start that failed (or was cancelled) half-way closes what it had opened: nothing is left at the broker."""
        if not producing.done():
            producing.cancel()
        elif not producing.cancelled() and producing.exception() is None:
            await self._connection.close_publisher(producing.result())
        for subscription in opened:
            await self._connection.unsubscribe(subscription)

    async def _until_receiving(self, queue: str) -> None:
        """Return once our subscription to `queue` has been seen to receive a message.

        `subscribe()` returns before the broker has the consumer's first
        permits, and a non-persistent topic drops what a consumer has no
        permits for: a request sent at once could have its answer dropped
        (measured: 4 calls in 2,520 lost during rapid reloads). So the client
        sends a ping to its own response queue, repeating it until it comes
        back. Other clients ignore the ping (no request of theirs has its id).
        """
        ping_id = f"ready-{uuid.uuid4().hex}"
        arrived = self._pending[ping_id] = _Answers()
        publisher = await self._connection.publisher(queue)
        loop = asyncio.get_running_loop()
        try:
            for _ in range(READY_ATTEMPTS):
                await publisher.send(b"{}", properties={"id": ping_id})
                if await self._next(arrived, loop, loop.time() + READY_INTERVAL):
                    return
            log.warning("client.not_confirmed", queue=queue, waited=READY_ATTEMPTS * READY_INTERVAL)
        finally:
            self._pending.pop(ping_id, None)
            await self._connection.close_publisher(publisher)

    async def _on_response(self, message: Envelope) -> None:
        request_id = message.properties.get("id")
        answers = self._pending.get(request_id) if request_id else None
        if answers is None:
            return  # another client's response, or one that arrived after its timeout
        try:
            body = json.loads(message.data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            body = {"error": {"type": "bad-response", "message": "response is not JSON"}, "end_of_stream": True}
        if not isinstance(body, dict):
            body = {
                "error": {"type": "bad-response", "message": "response is not a JSON object"},
                "end_of_stream": True,
            }
        answers.put(body)

    @staticmethod
    async def _next(answers: _Answers, loop: asyncio.AbstractEventLoop, until: float) -> bool:
        """Wait until a response is there (True) or the loop's clock reaches `until` (False).

        One future and one timer per wait: `asyncio.timeout_at` around a queue's get
        cost a task lookup, a loop lookup and a rescheduled timer on every answer.
        """
        if answers.bodies:
            return True
        waiter = answers.waiter = loop.create_future()
        timer = loop.call_at(until, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            answers.waiter = None
        return bool(answers.bodies)

    async def stream(
        self,
        request: BaseModel | dict[str, Any] | bytes,
        *,
        is_last: Callable[[dict[str, Any]], bool] = lambda body: True,
        timeout: float = DEFAULT_TIMEOUT,
        idle_timeout: float | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Yield each response to `request` until `is_last` says it was the last.

        `timeout` bounds the whole exchange, from the send to the last
        response, however steadily a stream moves; `idle_timeout`, if given,
        also bounds each wait for the next response. Past either,
        `RequestTimeout`. `properties` are sent with the request, beside `id`,
        `reply-to` and `timeout-ms` (the time left, so the server can stop
        when the caller stops waiting).
        """
        if self._publisher is None:
            await self.start()
        assert self._publisher is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        request_id = f"{self._id_prefix}{next(self._ids)}"
        answers = self._pending[request_id] = _Answers()
        sent = finished = False
        received = 0
        try:
            message = {**properties} if properties else {}
            message[ID] = request_id
            message[TIMEOUT_MS] = timeout_ms(deadline - loop.time())
            if self.reply_queue is not None:
                message[REPLY_TO] = self.reply_queue
            try:
                async with asyncio.timeout_at(deadline):
                    await self._publisher.send(request, properties=message)
            except TimeoutError:
                raise RequestTimeout(
                    f"could not send a request on {self.request_queue} within {timeout:g}s; is the broker up?"
                ) from None
            sent = True
            while True:
                idle_until = deadline if idle_timeout is None else min(deadline, loop.time() + idle_timeout)
                if not await self._next(answers, loop, idle_until):
                    raise self._timed_out(timeout, idle_timeout if idle_until < deadline else None, received)
                body = answers.bodies.popleft()
                received += 1
                finished = is_last(body)  # before the yield: a caller that stops at the last response gave up nothing
                yield body
                if finished:
                    return
        finally:
            self._pending.pop(request_id, None)
            if sent and not finished and self.cancel_queue is not None:
                self._cancel(request_id)

    def _timed_out(self, timeout: float, idle_timeout: float | None, received: int) -> RequestTimeout:
        if idle_timeout is not None:
            what = "no response" if not received else f"no further response after {received}"
            return RequestTimeout(
                f"{what} on {self.response_queue} for {idle_timeout:g}s (the idle timeout); the service behind"
                f" {self.request_queue} stalled"
            )
        if received:
            return RequestTimeout(
                f"the answer on {self.response_queue} was still streaming after {timeout:g}s (the call's timeout, "
                f"{received} responses in); raise the timeout for longer answers"
            )
        return RequestTimeout(
            f"no response on {self.response_queue} within {timeout:g}s; is a service consuming {self.request_queue}?"
        )

    def _cancel(self, request_id: str) -> None:
        """Tell the service, in the background, that nobody waits for `request_id` any more."""
        try:
            task = asyncio.get_running_loop().create_task(self._send_cancel(request_id))
        except RuntimeError:  # the generator was finalised after its loop ended: nothing can be sent
            return
        self._cancelling.add(task)
        task.add_done_callback(self._cancelling.discard)

    async def _send_cancel(self, request_id: str) -> None:
        assert self.cancel_queue is not None
        properties = {ID: request_id}
        if self.reply_queue is not None:
            properties[REPLY_TO] = self.reply_queue
        try:
            async with self._cancel_lock:
                if self._cancel_publisher is None:
                    self._cancel_publisher = await self._connection.publisher(self.cancel_queue)
            await self._cancel_publisher.send(b"{}", properties=properties)
        except TransportError as exc:
            log.debug("request.cancel_failed", queue=self.cancel_queue, id=request_id, error=str(exc))

    async def request(
        self, request: BaseModel | dict[str, Any] | bytes, *, timeout: float = DEFAULT_TIMEOUT
    ) -> dict[str, Any]:
        """One request, one response."""
        async with aclosing(self.stream(request, timeout=timeout)) as responses:
            async for body in responses:
                return body
        raise RequestTimeout("no response")  # pragma: no cover - stream always yields or raises

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _close_subscriptions(self) -> None:
        for sub in (self._subscription, self._private):
            if sub is not None:
                await self._connection.unsubscribe(sub)
        self._subscription = self._private = None

    async def close(self) -> None:
        if self._cancelling:
            await asyncio.wait(set(self._cancelling), timeout=CANCEL_CLOSE_WAIT)
        if self._cancel_publisher is not None:
            await self._connection.close_publisher(self._cancel_publisher)
            self._cancel_publisher = None
        await self._close_subscriptions()
        if self._publisher is not None:
            await self._connection.close_publisher(self._publisher)
            self._publisher = None

"""Request/response over a pair of queues, correlated on the `id` property.

The client side (`RequestClient`) subscribes to the response queue *before*
it sends anything: on a non-persistent topic a response published before the
subscription exists is gone. Every client has its own exclusive subscription
and keeps the responses whose `id` it issued.

Each client also has a private reply queue, `<response-queue>.<client id>`,
named in every request's `reply-to` property, and our servers answer there.
On the shared queue every client receives every client's answers: N agents
calling one service each received N times the traffic, and another agent's
answer over 64 KiB could cost a call its own answer (see `transport.Capabilities`). A
server that does not know `reply-to` answers on the shared queue, which the
client still reads, so either side may be older than the other.

The server side (`serve_requests`) is a Shared subscription on the request
queue, so instances of one service split the load.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel

from .errors import RequestTimeout, TransportError
from .logs import get_logger
from .transport import (
    LARGE_MESSAGE,
    Envelope,
    Publisher,
    Subscription,
    Transport,
    encode,
    unique_name,
)

log = get_logger("toolservice_base.rpc")

DEFAULT_TIMEOUT = 30.0
REPLY_TO = "reply-to"
MAX_REPLY_QUEUES = 1024
_REPLY_SUFFIX = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
READY_INTERVAL = 0.05
READY_ATTEMPTS = 40
_POWERS_OF_TEN = frozenset(10**k for k in range(10))


class RequestClient:
    """Send requests on one queue and collect their responses from another."""

    def __init__(
        self, connection: Transport, request_queue: str, response_queue: str, *, name: str = "client", bulk: bool = False
    ) -> None:
        """`bulk=True` when responses can exceed 64 KiB (see `Transport.subscribe`)."""
        self._connection = connection
        self._bulk = bulk
        self.request_queue = request_queue
        self.response_queue = response_queue
        self._name = name
        self._pending: dict[str, asyncio.Queue[dict[str, Any]]] = {}
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
                self._subscription = await self._connection.subscribe(
                    self.response_queue, self._on_response, subscription=unique_name(self._name), bulk=self._bulk
                )
                queues = [self.response_queue]
                if self.reply_queue is not None:
                    self._private = await self._connection.subscribe(
                        self.reply_queue, self._on_response, subscription=unique_name(self._name), bulk=self._bulk
                    )
                    queues.append(self.reply_queue)
                if self._connection.capabilities.confirm_subscription_receives:
                    await asyncio.gather(*(self._until_receiving(queue) for queue in queues))
                self._publisher = await self._connection.publisher(self.request_queue)
        return self

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
        arrived: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._pending[ping_id] = arrived
        publisher = await self._connection.publisher(queue)
        try:
            for _ in range(READY_ATTEMPTS):
                await publisher.send(b"{}", properties={"id": ping_id})
                try:
                    await asyncio.wait_for(arrived.get(), READY_INTERVAL)
                    return
                except TimeoutError:
                    continue
            log.warning("client.not_confirmed", queue=queue, waited=READY_ATTEMPTS * READY_INTERVAL)
        finally:
            self._pending.pop(ping_id, None)
            await self._connection.close_publisher(publisher)

    async def _on_response(self, message: Envelope) -> None:
        request_id = message.properties.get("id")
        queue = self._pending.get(request_id) if request_id else None
        if queue is None:
            return  # another client's response, or one that arrived after its timeout
        try:
            body = json.loads(message.data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            body = {"error": {"type": "bad-response", "message": "response is not JSON"}, "end_of_stream": True}
        if not isinstance(body, dict):
            body = {"error": {"type": "bad-response", "message": "response is not a JSON object"}, "end_of_stream": True}
        queue.put_nowait(body)

    async def stream(
        self,
        request: BaseModel | dict[str, Any],
        *,
        is_last: Callable[[dict[str, Any]], bool] = lambda body: True,
        timeout: float = DEFAULT_TIMEOUT,
        properties: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Yield each response to `request` until `is_last` says it was the last.

        `timeout` bounds the wait for each next response, so a long stream that
        keeps moving never times out, and a stalled one does. `properties` ride
        along on the request message (a tool name, a `traceparent`); `id` and
        `reply-to` are ours and win.
        """
        if self._publisher is None:
            await self.start()
        assert self._publisher is not None
        request_id = uuid.uuid4().hex
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._pending[request_id] = queue
        try:
            sent = {**properties} if properties else {}
            sent["id"] = request_id
            if self.reply_queue is not None:
                sent[REPLY_TO] = self.reply_queue
            await self._publisher.send(request, properties=sent)
            while True:
                try:
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for wraps the
                    # get in a task of its own, one more trip through the loop per answer.
                    async with asyncio.timeout(timeout):
                        body = await queue.get()
                except TimeoutError:
                    raise RequestTimeout(
                        f"no response on {self.response_queue} within {timeout:g}s; is a service consuming {self.request_queue}?"
                    ) from None
                yield body
                if is_last(body):
                    return
        finally:
            self._pending.pop(request_id, None)

    async def request(self, request: BaseModel | dict[str, Any], *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        """One request, one response."""
        async for body in self.stream(request, timeout=timeout):
            return body
        raise RequestTimeout("no response")  # pragma: no cover - stream always yields or raises

    async def close(self) -> None:
        for sub in (self._subscription, self._private):
            if sub is not None:
                await self._connection.unsubscribe(sub)
        self._subscription = self._private = None
        if self._publisher is not None:
            await self._connection.close_publisher(self._publisher)
            self._publisher = None


def private_queue(response_queue: str, client_id: str) -> str | None:
    """A client's own reply queue next to `response_queue`, or None if the name would be too long for a topic."""
    queue = f"{response_queue}.{client_id}"
    return queue if len(queue.rpartition("/")[2]) <= 200 else None


def reply_queue(response_queue: str, requested: str | None) -> str | None:
    """The queue a request asked to be answered on, if it is a private queue of `response_queue`.

    Anything else is ignored (the answer goes to the shared queue), so a request
    cannot make a server publish on a topic of its choosing.
    """
    prefix = response_queue + "."
    if requested and requested.startswith(prefix) and _REPLY_SUFFIX.match(requested[len(prefix) :]):
        return requested
    return None


Responder = Callable[[Envelope, Callable[[BaseModel | dict[str, Any]], Awaitable[None]]], Awaitable[None]]


class RequestServer:
    """Consume a request queue (Shared) and answer on the response queue.

    `handle(message, reply)` is called for each request; `reply(body)` sends a
    response carrying the request's `id`. At most `max_in_flight` handlers run
    at once; the rest wait their turn in arrival order.

    The receive loop itself never waits for a slot: on a non-persistent topic
    the broker drops messages for a consumer with no free permits, so a loop
    that stalled on back-pressure would lose requests. Past `max_backlog`
    waiting requests, new ones are answered at once with `busy`.
    """

    def __init__(
        self,
        connection: Transport,
        request_queue: str,
        response_queue: str,
        handle: Responder,
        *,
        subscription: str,
        max_in_flight: int = 64,
        max_backlog: int = 10_000,
        busy: Callable[[str], BaseModel | dict[str, Any]] | None = None,
    ) -> None:
        self._connection = connection
        self.request_queue = request_queue
        self.response_queue = response_queue
        self._handle = handle
        self._subscription_name = subscription
        self._slots = asyncio.Semaphore(max_in_flight)
        self._max_backlog = max_backlog
        self._busy = busy or (lambda message: {"error": {"type": "busy", "message": message}, "end_of_stream": True})
        self._tasks: set[asyncio.Task[None]] = set()
        self._publisher: Publisher | None = None
        self._replies: OrderedDict[str, asyncio.Future[Publisher | None]] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self._subscription: Subscription | None = None
        self.handled = 0
        self._large = 0

    async def start(self) -> None:
        self._publisher = await self._connection.publisher(self.response_queue)
        self._subscription = await self._connection.subscribe(
            self.request_queue,
            self._on_request,
            subscription=self._subscription_name,
            shared=True,
        )

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def connected(self) -> bool:
        """Subscribed, and the response producer is connected to the broker: requests can be answered."""
        return self._subscription is not None and self._publisher is not None and self._publisher.connected

    async def _on_request(self, message: Envelope) -> None:
        if len(self._tasks) >= self._max_backlog:
            log.warning("request.busy", queue=self.request_queue, backlog=len(self._tasks))
            busy = self._busy(f"{self.request_queue} has {len(self._tasks)} requests waiting; retry later")
            await self._send(busy, *self._return_address(message))
            return
        task = asyncio.create_task(self._run(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, body: BaseModel | dict[str, Any], request_id: str, reply_to: str | None) -> None:
        publisher = await self._reply_publisher(reply_to) if reply_to is not None else self._publisher
        assert publisher is not None
        data = encode(body)
        if len(data) > LARGE_MESSAGE:
            self._large += 1
            if self._large in _POWERS_OF_TEN:
                log.warning(
                    "response.large",
                    queue=self.response_queue,
                    bytes=len(data),
                    large_so_far=self._large,
                    hint="answers over 64 KiB can cost other calls on the caller's connection their answer; stream them in parts",
                )
        try:
            await publisher.send(data, properties={"id": request_id})
        except TransportError as exc:
            log.warning("response.send_failed", queue=publisher.topic, id=request_id, error=str(exc))

    async def _reply_publisher(self, queue: str) -> Publisher | None:
        """The producer for a client's private queue: opened on its first answer, the least recently used closed past 1,024.

        If it cannot be opened (say the broker refuses to create topics), the
        answer goes to the shared queue, which every client also reads.
        """
        opening = self._replies.get(queue)
        if opening is None:
            opening = self._replies[queue] = asyncio.ensure_future(self._connection.publisher(queue))
            if len(self._replies) > MAX_REPLY_QUEUES:
                _, oldest = self._replies.popitem(last=False)
                closing = asyncio.create_task(self._close_reply(oldest))
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
        else:
            self._replies.move_to_end(queue)
        try:
            return await asyncio.shield(opening)
        except TransportError as exc:
            if self._replies.get(queue) is opening:
                # Remembered: later answers to this caller go to the shared queue at once.
                shared = asyncio.get_running_loop().create_future()
                shared.set_result(self._publisher)
                self._replies[queue] = shared
                log.warning("response.reply_queue_failed", queue=queue, error=str(exc), fallback=self.response_queue)
            return self._publisher

    async def _close_reply(self, opening: asyncio.Future[Publisher | None]) -> None:
        try:
            publisher = await opening
        except TransportError:
            return
        if publisher is not None and publisher is not self._publisher:
            await self._connection.close_publisher(publisher)

    def _return_address(self, message: Envelope) -> tuple[str, str | None]:
        """The request's `id`, and the private queue to answer on (None: the shared queue)."""
        properties = message.properties
        return properties.get("id", ""), reply_queue(self.response_queue, properties.get(REPLY_TO))

    async def _run(self, message: Envelope) -> None:
        request_id, reply_to = self._return_address(message)

        async def reply(body: BaseModel | dict[str, Any]) -> None:
            await self._send(body, request_id, reply_to)

        # No per-request log line here: a structlog call costs more than the rest of
        # this method (py-spy: 5% of a service's main thread); latency is in the metrics.
        async with self._slots:
            try:
                await self._handle(message, reply)
            except Exception:
                log.exception("request.handler_failed", queue=self.request_queue, id=request_id)
            finally:
                self.handled += 1

    async def stop_receiving(self) -> None:
        """Stop taking new requests; in-flight ones go on."""
        if self._subscription is not None:
            await self._connection.unsubscribe(self._subscription)
            self._subscription = None

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait for in-flight handlers, then close the response producers."""
        if self._tasks:
            done, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()
        replies, self._replies = list(self._replies.values()), OrderedDict()
        for opening in replies:
            await self._close_reply(opening)
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=timeout)
        if self._publisher is not None:
            await self._connection.close_publisher(self._publisher)
            self._publisher = None

    async def stop(self, timeout: float = 30.0) -> None:
        await self.stop_receiving()
        await self.drain(timeout)

"""The caller's side of request/response: `RequestClient`, and each call it makes (`_Call`, its `Inbox`).

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

A client given the service's `answer_key` takes an answer only if that key
signed it (`answer-signature`, over the request's id and the answer's
bytes): anyone who may publish on the response queue could otherwise answer
another's calls first. A dropped answer is logged and reported; the call
waits on for the genuine one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Self

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel

from toolservice_base.errors import RequestTimeout, TransportError
from toolservice_base.logs import get_logger
from toolservice_base.signing import answer_checker
from toolservice_base.tasks import close_when_granted
from toolservice_base.transport import Envelope, Publisher, Subscription, Transport, unique_name

from .limits import DEFAULT_CALL_TIMEOUT, DEFAULT_LIMITS, CallLimits
from .wire import ANSWER_SIGNATURE, ID, REPLY_TO, TIMEOUT_MS, cancel_queue, private_queue, timeout_ms

log = get_logger("toolservice_base.rpc")

READY_INTERVAL = 0.05
READY_ATTEMPTS = 40
CANCEL_CLOSE_WAIT = 1.0


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
        answer_key: Ed25519PublicKey | None = None,
        on_dropped: Callable[[str, str], None] | None = None,
    ) -> None:
        """`bulk=True` when responses can exceed 64 KiB (see `Transport.subscribe`); `cancels=True` to send cancels.

        `answer_key`: the service's public key, when its config carries one; an answer it did not sign is dropped
        (the call goes on waiting for the genuine one) and reported to `on_dropped(request_id, why)`."""
        self._check_answer: Callable[[str, bytes, str | None], str | None] | None = None
        self._on_dropped = on_dropped
        self._pings: set[str] = set()
        self.answer_key = answer_key
        self.cancel_queue = cancel_queue(request_queue) if cancels else None
        self._cancel_publisher: Publisher | None = None
        self._cancel_lock = asyncio.Lock()
        self._cancelling: set[asyncio.Task[None]] = set()
        self._connection = connection
        self._bulk = bulk
        self.request_queue = request_queue
        self.response_queue = response_queue
        self._name = name
        self._pending: dict[str, Inbox] = {}
        # Request ids: this client's random prefix and a counter. Unique across clients as uuid4 is, without a
        # getrandom() call per request (8 % of a caller's loop thread at 64 calls in flight, measured with py-spy).
        self._id_prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count()
        self._publisher: Publisher | None = None
        self._subscription: Subscription | None = None
        self._private: Subscription | None = None
        self.reply_queue = private_queue(response_queue, uuid.uuid4().hex[:16])
        self._start_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing_pingers: asyncio.Future[None] | None = None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def answer_key(self) -> Ed25519PublicKey | None:
        """The key the service's answers must be signed with (None: any answer with a pending id is taken)."""
        return self._answer_key

    @answer_key.setter
    def answer_key(self, key: Ed25519PublicKey | None) -> None:
        self._answer_key = key
        self._check_answer = None if key is None else answer_checker(key)

    async def start(self) -> "RequestClient":
        async with self._start_lock:
            if self._publisher is None:
                # The loop its subscriptions deliver on; calls read it from here (on Python 3.11 every
                # get_running_loop() is a getpid() system call: 2 % of a caller's loop at 64 calls in flight).
                self._loop = asyncio.get_running_loop()
                # The subscriptions, the producer and (`_until_receiving`) the producers that ping, all opened at
                # once: a new client costs one broker round trip for all of it, then one ping.
                queues = [self.response_queue, *([self.reply_queue] if self.reply_queue is not None else [])]
                confirm = self._connection.capabilities.confirm_subscription_receives
                producing = [asyncio.ensure_future(self._connection.publisher(self.request_queue))]
                if confirm:
                    producing += [asyncio.ensure_future(self._connection.publisher(queue)) for queue in queues]
                opened: list[Subscription] = []
                try:
                    results = await asyncio.gather(
                        *(
                            self._connection.subscribe(
                                queue,
                                self._on_response,
                                subscription=unique_name(self._name),
                                bulk=self._bulk,
                                inline=True,
                            )
                            for queue in queues
                        ),
                        return_exceptions=True,
                    )
                    opened = [result for result in results if not isinstance(result, BaseException)]
                    publisher, *pingers = await asyncio.gather(*producing)
                    if failure := next((result for result in results if isinstance(result, BaseException)), None):
                        raise failure
                    self._subscription = opened[0]
                    self._private = opened[1] if len(opened) > 1 else None
                    if confirm:
                        await asyncio.gather(*map(self._until_receiving, queues, pingers))
                except BaseException:
                    self._subscription = self._private = None
                    await self._abandon(producing, opened)
                    raise
                if pingers:  # their work is done: closed off the caller's path (`close` waits for it)
                    self._closing_pingers = asyncio.ensure_future(self._close_all(pingers))
                self._publisher = publisher
        return self

    async def _close_all(self, publishers: list[Publisher]) -> None:
        """Close the ping producers; one the broker fails to close is logged (the transport's close ends it anyway)."""
        for result in await asyncio.gather(*map(self._connection.close_publisher, publishers), return_exceptions=True):
            if isinstance(result, Exception):
                log.debug("client.ping_producer_close_failed", queue=self.response_queue, error=str(result))

    async def _abandon(self, producing: "Sequence[asyncio.Future[Publisher]]", opened: list[Subscription]) -> None:
        """A start that failed (or was cancelled) half-way closes what it had opened: nothing is left at the broker.

        A producer still opening is neither waited for (the caller may be
        giving up on a broker that does not answer) nor cancelled (a cancelled
        open may still create it): it is closed when it opens.
        """
        for future in producing:
            if not future.done():
                close_when_granted(future, self._connection.close_publisher, _closing)
            elif not future.cancelled() and future.exception() is None:
                await self._connection.close_publisher(future.result())
        for subscription in opened:
            await self._connection.unsubscribe(subscription)

    async def _until_receiving(self, queue: str, publisher: Publisher) -> None:
        """Return once our subscription to `queue` has been seen to receive a message.

        `subscribe()` returns before the broker has the consumer's first
        permits, and a non-persistent topic drops what a consumer has no
        permits for: a request sent at once could have its answer dropped
        (measured: 4 calls in 2,520 lost during rapid reloads). So the client
        pings its own queue with `publisher` until the ping comes back. Other
        clients ignore it (no request of theirs has its id).
        """
        ping_id = f"ready-{uuid.uuid4().hex}"
        arrived = self._pending[ping_id] = Inbox()
        self._pings.add(ping_id)  # our own message, never the service's: not signed
        loop = asyncio.get_running_loop()
        try:
            for _ in range(READY_ATTEMPTS):
                await publisher.send(b"{}", properties={"id": ping_id})
                if await arrived.wait_until(loop, loop.time() + READY_INTERVAL):
                    return
            log.warning("client.not_confirmed", queue=queue, waited=READY_ATTEMPTS * READY_INTERVAL)
        finally:
            self._pending.pop(ping_id, None)
            self._pings.discard(ping_id)

    def _on_response(self, message: Envelope) -> None:
        """Inline on the loop as each response arrives: it wakes the call waiting for it, with no task step between."""
        request_id = message.properties.get("id")
        answers = self._pending.get(request_id) if request_id else None
        if answers is None or request_id is None:
            return  # another client's response, or one that arrived after its timeout
        check = self._check_answer
        if check is not None and request_id not in self._pings:
            why = check(request_id, message.data, message.properties.get(ANSWER_SIGNATURE))
            if why is not None:
                self._dropped(request_id, why, message)
                return
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

    def _dropped(self, request_id: str, why: str, message: Envelope) -> None:
        """An answer the service's key did not sign: not the service's, so not the caller's either. The call waits
        on for the genuine answer, until its deadline."""
        log.warning(
            "response.dropped_unsigned" if why == "unsigned" else "response.dropped_forged",
            queue=self.response_queue,
            topic=message.topic,
            id=request_id,
            reason=why,
            hint="an answer on this queue was not signed by the key the registry accepted the service with",
        )
        if self._on_dropped is not None:
            self._on_dropped(request_id, why)

    async def stream(
        self,
        request: BaseModel | dict[str, Any] | bytes,
        *,
        is_last: Callable[[dict[str, Any]], bool] = lambda body: True,
        limits: CallLimits = DEFAULT_LIMITS,
        properties: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Yield each response to `request` until `is_last` says it was the last.

        `limits.timeout` bounds the whole exchange, from the send to the last
        response, however steadily a stream moves; `limits.idle_timeout`, if
        given, also bounds each wait for the next response. Past either,
        `RequestTimeout`. `properties` are sent with the request, beside `id`,
        `reply-to` and `timeout-ms` (the time left, so the server can stop
        when the caller stops waiting). A request the broker never took raises
        the transport's error.
        """
        if self._publisher is None:
            await self.start()
        call = _Call(self, limits.timeout, limits.idle_timeout)
        try:
            await call.send(request, properties)
            while True:
                body = await call.next()
                call.finished = is_last(body)  # before the yield: a caller that stops at the last one gave up nothing
                yield body
                if call.finished:
                    return
        finally:
            call.end()

    async def exchange(
        self,
        request: BaseModel | dict[str, Any] | bytes,
        each: Callable[[dict[str, Any]], None],
        *,
        is_last: Callable[[dict[str, Any]], bool] = lambda body: True,
        limits: CallLimits = DEFAULT_LIMITS,
        properties: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> None:
        """`stream` for a caller that takes each response as it comes: `each(body)`, with no async generator
        between (a call through `stream` paid for one per layer). What `each` raises ends the call, and the service
        is told to stop (if that was not the last response)."""
        if self._publisher is None:
            await self.start()
        call = _Call(self, limits.timeout, limits.idle_timeout, request_id)
        try:
            await call.send(request, properties)
            while True:
                body = await call.next()
                call.finished = is_last(body)
                each(body)
                if call.finished:
                    return
        finally:
            call.end()

    def _timed_out(self, timeout: float, idle_timeout: float | None, received: int) -> RequestTimeout:
        if idle_timeout is not None:
            what = "no response" if not received else f"no further response after {received}"
            return RequestTimeout(
                f"{what} on {self.response_queue} for {idle_timeout:g}s (the idle timeout); the service behind"
                f" {self.request_queue} stalled",
                received=received,
            )
        if received:
            return RequestTimeout(
                f"the call exceeded its total deadline of {timeout:g}s while still streaming progress ({received} "
                f"progress messages received on {self.response_queue}); raise the timeout for longer answers",
                received=received,
            )
        if self._publisher is not None and not self._publisher.connected:
            return RequestTimeout(
                f"could not send a request on {self.request_queue} within {timeout:g}s; is the broker up?"
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
            await self._cancel_publisher.send(b"{}", properties=properties, confirm=False, on_failure=_cancel_lost)
        except TransportError as exc:
            log.debug("request.cancel_failed", queue=self.cancel_queue, id=request_id, error=str(exc))

    def new_id(self) -> str:
        """A request id no other request of any client has."""
        return f"{self._id_prefix}{next(self._ids)}"

    async def request(
        self,
        request: BaseModel | dict[str, Any] | bytes,
        *,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """One request, one response, within `timeout` seconds (the only bound one answer has). `request_id`: the
        id to send it under, for a resend of a request that went unanswered (`new_id`), so a server that got both
        can tell; a new one if not given."""
        bodies: list[dict[str, Any]] = []
        await self.exchange(request, bodies.append, limits=CallLimits(timeout), request_id=request_id)
        return bodies[0]

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
        if self._closing_pingers is not None:
            await asyncio.gather(self._closing_pingers, return_exceptions=True)
            self._closing_pingers = None
        if self._cancelling:
            await asyncio.wait(set(self._cancelling), timeout=CANCEL_CLOSE_WAIT)
        if self._cancel_publisher is not None:
            await self._connection.close_publisher(self._cancel_publisher)
            self._cancel_publisher = None
        await self._close_subscriptions()
        if self._publisher is not None:
            await self._connection.close_publisher(self._publisher)
            self._publisher = None


_closing: set[asyncio.Future[Any]] = set()
"""Producers a failed start closes once they open: held here until closed (the loop keeps only weak references)."""


def _cancel_lost(error: TransportError) -> None:
    log.debug("request.cancel_failed", error=str(error))


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

    async def wait_until(self, loop: asyncio.AbstractEventLoop, until: float) -> bool:
        """Wait until a response is there (True) or the loop's clock reaches `until` (False); also False at once
        when the request's send failed (`failure`).

        One future and one timer per wait: `asyncio.timeout_at` around a queue's get
        cost a task lookup, a loop lookup and a rescheduled timer on every answer.
        """
        if self.bodies:
            return True
        if self.failure is not None:
            return False
        waiter = self.waiter = loop.create_future()
        timer = loop.call_at(until, time_is_up, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None
        return bool(self.bodies)


def time_is_up(waiter: asyncio.Future[None]) -> None:
    """A wait's time is up: the waiter wakes to find nothing new."""
    if not waiter.done():
        waiter.set_result(None)


class _Call:
    """One request in flight: registered for its answers, sent, waited on, and let go (`end`).

    One timer bounds the whole call: at the deadline it wakes the wait for the
    next response, or cancels a send still waiting for room in the producer's
    queue (which then raises `RequestTimeout`, as `asyncio.timeout_at` would,
    without its two loop lookups and its timer per call; each wait for a
    response needs a timer of its own only under an idle timeout).
    """

    __slots__ = (
        "_client",
        "_loop",
        "_timer",
        "_sending",
        "request_id",
        "answers",
        "deadline",
        "timeout",
        "idle_timeout",
        "received",
        "sent",
        "finished",
        "expired",
    )

    def __init__(
        self, client: RequestClient, timeout: float, idle_timeout: float | None, request_id: str | None = None
    ) -> None:
        self._client = client
        self._loop = loop = client._loop or asyncio.get_running_loop()
        self.deadline = loop.time() + timeout
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.request_id = request_id or client.new_id()
        self.answers = client._pending[self.request_id] = Inbox()
        self.received = 0
        self.sent = self.finished = self.expired = False
        self._sending: asyncio.Task[Any] | None = None
        self._timer = loop.call_at(self.deadline, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self._sending is not None:
            self._sending.cancel()
        self.answers.wake()

    async def send(self, request: BaseModel | dict[str, Any] | bytes, properties: Mapping[str, str] | None) -> None:
        client = self._client
        publisher = client._publisher
        assert publisher is not None
        message = {**properties} if properties else {}
        message[ID] = self.request_id
        message[TIMEOUT_MS] = timeout_ms(self.deadline - self._loop.time())
        if client.reply_queue is not None:
            message[REPLY_TO] = client.reply_queue
        task = self._sending = asyncio.current_task(self._loop)
        cancelling = task.cancelling() if task is not None else 0
        # Unconfirmed: the answer is the receipt. Only a full producer queue makes this wait.
        try:
            await publisher.send(request, properties=message, confirm=False, on_failure=self.answers.fail)
        except asyncio.CancelledError:
            if self.expired and task is not None and task.uncancel() <= cancelling:
                raise RequestTimeout(
                    f"could not send a request on {client.request_queue} within {self.timeout:g}s; is the broker up?"
                ) from None
            raise
        finally:
            self._sending = None
        self.sent = True

    async def next(self) -> dict[str, Any]:
        """The next response; `RequestTimeout` past the deadline (or the idle timeout), the transport's error if the
        request was never taken."""
        answers, idle_timeout = self.answers, self.idle_timeout
        idle_binds = False
        if not answers.bodies and answers.failure is None and not self.expired:
            if idle_timeout is None:
                await answers.wait(self._loop)  # woken by a response, a failed send, or the call's deadline
            else:
                idle_until = self._loop.time() + idle_timeout
                idle_binds = idle_until < self.deadline
                await answers.wait_until(self._loop, min(idle_until, self.deadline))
        if answers.bodies:
            self.received += 1
            return answers.bodies.popleft()
        if answers.failure is not None:
            raise answers.failure
        raise self._client._timed_out(self.timeout, idle_timeout if idle_binds else None, self.received)

    def end(self) -> None:
        self._timer.cancel()
        client = self._client
        client._pending.pop(self.request_id, None)
        if self.sent and not self.finished and client.cancel_queue is not None:
            client._cancel(self.request_id)

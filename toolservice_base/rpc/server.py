"""The server's side of request/response: `RequestServer`.

A Shared subscription on the request queue, so instances of one service split
the load; answers go to the caller's private reply queue (`reply-to`) or the
shared response queue.

A server made `cancellable` stops the work nobody waits for: each request
gets a deadline, the caller's (`timeout-ms`) or the server's own `limit`,
whichever comes first, and a cancel from its caller (`rpc_wire.cancel_queue`)
ends it at once. Either way its slot is free again within `cancel_grace`,
even if the handler ignores its cancellation. Without these, one tool that
never returns filled every slot of its service for good.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Self

from toolservice_base.errors import MessageTooLarge, TransportError
from toolservice_base.logs import get_logger
from toolservice_base.transport import (
    LARGE_MESSAGE,
    MESSAGE_LIMIT,
    Envelope,
    Publisher,
    Subscription,
    Transport,
    encode,
    unique_name,
)

from .answers import Body, answer_too_large, error_body, request_deadline
from .eager import start_now
from .expiry import Expiry
from .wire import ANSWER_SIGNATURE, ID, REPLY_TO, caller_timeout, cancel_queue, reply_queue

log = get_logger("toolservice_base.rpc")

MAX_REPLY_QUEUES = 1024
CANCEL_GRACE = 1.0
"""Seconds a cancelled handler has to end before its slot is given to the next request anyway."""
_POWERS_OF_TEN = frozenset(10**k for k in range(10))
Responder = Callable[[Envelope, Callable[[Body], Awaitable[None]]], Awaitable[None]]
CallKey = tuple[str, str | None]
"""A request as its caller names it in a cancel: (`id`, `reply-to`)."""


class _Reply:
    """Answers one request (`reply(body)`), and remembers whether its last answer went out."""

    __slots__ = ("_server", "_request_id", "_reply_to", "finished")

    def __init__(self, server: "RequestServer", request_id: str, reply_to: str | None) -> None:
        self._server, self._request_id, self._reply_to = server, request_id, reply_to
        self.finished = False

    async def __call__(self, body: Body) -> None:
        await self._server._send(body, self._request_id, self._reply_to)
        # A body is the last unless it says `end_of_stream: false` (single-answer protocols never say it).
        if isinstance(body, bytes):
            self.finished = True
            return
        more = body.get("end_of_stream") if isinstance(body, dict) else getattr(body, "end_of_stream", None)
        self.finished = more is not False


class RequestServer:
    """Consume a request queue (Shared) and answer on the response queue.

    `handle(message, reply)` is called for each request; `reply(body)` sends a
    response carrying the request's `id`. At most `max_in_flight` handlers run
    at once; up to `max_backlog` more wait their turn in arrival order, and
    past that a request is answered `busy` at once.

    The receive loop itself never waits for a slot: on a non-persistent topic
    the broker drops messages for a consumer with no free permits, so a loop
    that stalled on back-pressure would lose requests.

    An answer the broker refuses as too large is replaced by `too_large(reason)`
    (default: an `answer-too-large` error), so the caller hears at once.

    `sign_answer(request_id, data)`, if given, makes each answer's
    `answer-signature` property, so a caller can tell this service's answers
    from anyone else's on the response queue.

    `cancellable=True` honours the callers' deadlines and cancels (see the
    module); `limit(message)` is the server's own limit on one request, in
    seconds (None: no limit). A request that reaches the server's limit is
    answered `timeout` (or `busy`, if it never got a slot); one whose caller
    gave up is not answered.
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
        busy: Callable[[str], Body] | None = None,
        too_large: Callable[[str], Body] | None = None,
        cancellable: bool = False,
        limit: Callable[[Envelope], float | None] | None = None,
        cancel_grace: float = CANCEL_GRACE,
        sign_answer: Callable[[str, bytes], str] | None = None,
    ) -> None:
        self._connection = connection
        self._sign_answer = sign_answer
        """Signs each answer (`signing.answer_signer`), for callers that check who answered; None: unsigned."""
        self.request_queue = request_queue
        self.response_queue = response_queue
        self._handle = handle
        self._subscription_name = subscription
        self._slots = asyncio.Semaphore(max_in_flight)
        self._max_admitted = max_in_flight + max_backlog
        self._busy = busy or partial(error_body, "busy")
        self._too_large = too_large or answer_too_large
        self._cancellable = cancellable
        self._limit = limit
        self._cancel_grace = cancel_grace
        self.cancel_queue = cancel_queue(request_queue) if cancellable else None
        self._tasks: set[asyncio.Task[None]] = set()
        self._calls: dict[CallKey, asyncio.Task[None]] = {}
        self._holding: dict[asyncio.Task[None], Expiry | None] = {}
        """Requests holding a slot, and their deadline's timer."""
        self._stepping = False
        """A request's first step runs now, inside `_on_request`, which sets its deadline's timer if it waits."""
        self._abandoned: set[asyncio.Task[None]] = set()
        self._publisher: Publisher | None = None
        self._replies: OrderedDict[str, asyncio.Future[Publisher | None]] = OrderedDict()
        self._background: set[asyncio.Task[None]] = set()
        self._subscription: Subscription | None = None
        self._cancels: Subscription | None = None
        self.handled = 0
        self.refused_busy = 0
        self.expired = 0
        """Requests ended at a deadline, the caller's or the server's."""
        self.cancelled = 0
        """Requests ended by a cancel from their caller."""
        self._large = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop requests are handled on (from `start`): on Python 3.11 each get_running_loop() is a getpid()
        system call, 7 % of a service's loop at 64 calls in flight when asked three times per request."""

    async def start(self) -> None:
        """The response producer and the cancel subscription at once; then, once answers can go out, the request queue.

        A request may be waiting the moment we subscribe (a caller of a
        previous instance), so the producer it is answered through comes
        first. If a step fails, what opened is kept for `stop` to close.
        """
        self._loop = asyncio.get_running_loop()
        publisher, cancels = await asyncio.gather(
            self._connection.publisher(self.response_queue),
            # A subscription per instance: every instance hears every cancel; the one doing the work stops it.
            self._open_cancels(),
            return_exceptions=True,
        )
        if not isinstance(publisher, BaseException):
            self._publisher = publisher
        if not isinstance(cancels, BaseException):
            self._cancels = cancels
        for failure in (publisher, cancels):
            if isinstance(failure, BaseException):
                raise failure
        self._subscription = await self._connection.subscribe(
            self.request_queue,
            self._on_request,
            subscription=self._subscription_name,
            shared=True,
            inline=True,
        )

    async def _open_cancels(self) -> Subscription | None:
        if self.cancel_queue is None:
            return None
        return await self._connection.subscribe(
            self.cancel_queue,
            self._on_cancel,
            subscription=unique_name(f"{self._subscription_name}-cancel"),
            inline=True,
        )

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def connected(self) -> bool:
        """Subscribed and attached, and the response producer connected: requests come in and can be answered.

        Both ends count: a role whose consume permission was revoked keeps its
        producer, and would look ready while no request reaches it.
        """
        return (
            self._subscription is not None
            and self._subscription.connected
            and self._publisher is not None
            and self._publisher.connected
        )

    # --- taking requests -----------------------------------------------------------

    def _on_request(self, message: Envelope) -> None:
        """Inline on the loop as each request arrives: it starts the request's task (or answers `busy`), and never
        waits for a slot, so the next request is taken at once. The task's first step runs here (`start_now`): a
        handler that answers without waiting has answered by the time this returns."""
        loop = self._loop or asyncio.get_running_loop()
        admitted = len(self._tasks) - len(self._abandoned)
        address = self._return_address(message)
        if admitted >= self._max_admitted:
            self.refused_busy += 1
            log.warning("request.busy", queue=self.request_queue, admitted=admitted)
            busy = self._busy(f"{self.request_queue} has {admitted} calls running or waiting; retry later")
            answering = loop.create_task(self._send(busy, *address))
            self._background.add(answering)
            answering.add_done_callback(self._background.discard)
            return
        deadline, limit = self._deadline(message, loop)
        # Its first step runs now: a request answered without waiting (most are) is done here, and needs no tracking.
        stepping, self._stepping = self._stepping, True
        try:
            task = start_now(loop, self._run(message, address, deadline, limit))
        finally:
            self._stepping = stepping
        if task.done():
            return
        expiry = self._holding.get(task)
        if expiry is not None:  # it holds a slot and waits: from now on its deadline can end it
            expiry.arm(loop)
        self._tasks.add(task)
        key: CallKey | None = None
        if self._cancellable:
            key = address
            self._calls[key] = task
        task.add_done_callback(partial(self._finished, key))

    def _deadline(self, message: Envelope, loop: asyncio.AbstractEventLoop) -> tuple[float | None, float | None]:
        """When the request's work must end (loop time), and the server's limit if that is what ends it."""
        if not self._cancellable and self._limit is None:
            return None, None
        now = loop.time()
        waits = caller_timeout(message) if self._cancellable else None
        limit = self._limit(message) if self._limit is not None else None
        if limit is not None and (waits is None or limit <= waits):
            return now + limit, limit
        return (None if waits is None else now + waits), None

    def _finished(self, key: CallKey | None, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._abandoned.discard(task)
        if key is not None and self._calls.get(key) is task:
            del self._calls[key]

    def _return_address(self, message: Envelope) -> tuple[str, str | None]:
        """The request's `id`, and the private queue to answer on (None: the shared queue)."""
        properties = message.properties
        return properties.get(ID, ""), reply_queue(self.response_queue, properties.get(REPLY_TO))

    # --- running them ------------------------------------------------------------------

    async def _run(self, message: Envelope, address: CallKey, deadline: float | None, limit: float | None) -> None:
        request_id, reply_to = address
        request_deadline.set(deadline)  # this task's own context: see past_deadline()
        reply = _Reply(self, request_id, reply_to)
        # No per-request log line here: a structlog call costs more than the rest of
        # this method (py-spy: 5% of a service's main thread); latency is in the metrics.
        if deadline is None and not self._cancellable:
            async with self._slots:
                await self._call(message, reply, request_id)
            return
        waited = self._slots.locked()
        if waited:  # a wait for a slot, bounded by the deadline; a free slot is taken without a timer
            try:
                async with asyncio.timeout_at(deadline):
                    await self._slots.acquire()
            except TimeoutError:
                await self._expired(reply, request_id, limit, started=False)
                return
        else:
            await self._slots.acquire()
        loop = self._loop or asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        # One timer for the deadline: it cancels the call and only then arms the slot's guard (`_abandon`), where
        # asyncio.timeout_at and a guard timer of its own cost two per request. In a first step that `_on_request`
        # runs, the timer is left to it, for the case the call waits.
        expiry = None if deadline is None else Expiry(task, request_id, deadline, self._cancel_grace, self._abandon)
        self._holding[task] = expiry
        if expiry is not None and (waited or not self._stepping):
            expiry.arm(loop)
        try:
            await self._call(message, reply, request_id)
        except asyncio.CancelledError:
            if expiry is None or not expiry.ended_the_call():
                raise
            await self._expired(reply, request_id, limit, started=True)
        finally:
            if expiry is not None:
                expiry.cancel()
            if task in self._holding:
                del self._holding[task]
                self._slots.release()

    async def _call(self, message: Envelope, reply: "_Reply", request_id: str) -> None:
        """Run the handler; one that raises before its last answer has the caller told so, not left to time out."""
        try:
            await self._handle(message, reply)
        except Exception as exc:
            log.exception("request.handler_failed", queue=self.request_queue, id=request_id)
            if not reply.finished:
                await reply(
                    error_body(
                        "internal-error",
                        f"{self.request_queue} failed while handling the request ({type(exc).__name__}); the"
                        " service's log has the details",
                    )
                )
        finally:
            self.handled += 1

    async def _expired(
        self, reply: Callable[[Body], Awaitable[None]], request_id: str, limit: float | None, *, started: bool
    ) -> None:
        """A request reached its deadline: answer it if the limit was ours (its caller still waits), else let it go."""
        self.expired += 1
        if limit is None:
            log.debug("request.caller_gone", queue=self.request_queue, id=request_id, started=started)
            return
        log.warning("request.limit_reached", queue=self.request_queue, id=request_id, limit=limit, started=started)
        if started:
            await reply(
                error_body(
                    "timeout",
                    f"the call did not finish within {limit:g}s, the limit the service sets on one call"
                    f" ({self.request_queue})",
                )
            )
        else:
            await reply(self._busy(f"{self.request_queue} had no free slot for {limit:g}s; retry later"))

    def _abandon(self, task: asyncio.Task[None], request_id: str) -> None:
        """Give a cancelled request's slot to the next one, if its handler has not let go of it yet."""
        if task in self._holding and not task.done():
            del self._holding[task]
            self._abandoned.add(task)
            self._slots.release()
            log.warning(
                "request.cancel_ignored",
                queue=self.request_queue,
                id=request_id,
                grace=self._cancel_grace,
                hint="the handler goes on after its cancellation; its slot was released anyway",
            )

    def _on_cancel(self, message: Envelope) -> None:
        task = self._calls.get(self._return_address(message))
        if task is None or task.done():
            return  # finished already, or another instance's call
        self.cancelled += 1
        task.cancel()
        asyncio.get_running_loop().call_later(self._cancel_grace, self._abandon, task, message.properties.get(ID, ""))

    # --- answering ----------------------------------------------------------------------

    async def _send(self, body: Body, request_id: str, reply_to: str | None) -> None:
        publisher = self._publisher
        if reply_to is not None:
            publisher = self._open_reply_publisher(reply_to) or await self._reply_publisher(reply_to)
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
                    hint=(
                        "answers over 64 KiB can cost other calls on the caller's connection their answer; stream them"
                        " in parts"
                    ),
                )
        try:
            # Unconfirmed: a failure found later is logged as it was (`_lost`); one over 64 KiB is confirmed.
            lost = partial(_lost, publisher.topic, request_id)
            await publisher.send(data, properties=self._properties(request_id, data), confirm=False, on_failure=lost)
        except MessageTooLarge:
            # The caller would wait for its timeout and then blame the service: tell it now, in a message that fits.
            log.warning("response.too_large", queue=publisher.topic, id=request_id, bytes=len(data))
            reason = (
                f"the answer is {len(data)} bytes, over the broker's message limit ({MESSAGE_LIMIT} bytes unless the "
                f"broker sets another) on {self.request_queue}"
            )
            try:
                refusal = encode(self._too_large(reason))
                await publisher.send(refusal, properties=self._properties(request_id, refusal))
            except TransportError as exc:
                log.warning("response.send_failed", queue=publisher.topic, id=request_id, error=str(exc))
        except TransportError as exc:
            log.warning("response.send_failed", queue=publisher.topic, id=request_id, error=str(exc))

    def _properties(self, request_id: str, data: bytes) -> dict[str, str]:
        """An answer's properties: the request's id, and the answer's signature when the server signs."""
        if self._sign_answer is None:
            return {ID: request_id}
        return {ID: request_id, ANSWER_SIGNATURE: self._sign_answer(request_id, data)}

    def _open_reply_publisher(self, queue: str) -> Publisher | None:
        """The producer for a client's private queue if it is open already (every answer but a caller's first): taken
        without a coroutine and a shield per answer."""
        opening = self._replies.get(queue)
        if opening is None or not opening.done() or opening.cancelled() or opening.exception() is not None:
            return None
        self._replies.move_to_end(queue)
        return opening.result()

    async def _reply_publisher(self, queue: str) -> Publisher | None:
        """The producer for a client's private queue: opened on its first answer, the least recently used closed past
        1,024.

        If it cannot be opened (say the broker refuses to create topics), the
        answer goes to the shared queue, which every client also reads.
        """
        opening = self._replies.get(queue)
        if opening is None:
            opening = self._replies[queue] = asyncio.ensure_future(self._connection.publisher(queue))
            if len(self._replies) > MAX_REPLY_QUEUES:
                _, oldest = self._replies.popitem(last=False)
                closing = asyncio.create_task(self._close_reply(oldest))
                self._background.add(closing)
                closing.add_done_callback(self._background.discard)
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

    # --- stopping -------------------------------------------------------------------------

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
        if self._cancels is not None:
            await self._connection.unsubscribe(self._cancels)
            self._cancels = None
        replies, self._replies = list(self._replies.values()), OrderedDict()
        for opening in replies:
            await self._close_reply(opening)
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout)
        if self._publisher is not None:
            await self._connection.close_publisher(self._publisher)
            self._publisher = None

    async def stop(self, timeout: float = 30.0) -> None:
        await self.stop_receiving()
        await self.drain(timeout)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _lost(queue: str, request_id: str, error: TransportError) -> None:
    """An answer the broker never took (its send timed out, say): the caller will time out."""
    log.warning("response.send_failed", queue=queue, id=request_id, error=str(error))

"""`ToolServiceClient`: calls to one tool service over its request/response queues.

`toolservice_base.rpc.RequestClient` already does the Pulsar part (subscribe to
the response queue before the first send, correlate on the `id` property, bound
the call). This adds the tool-service protocol on top (JSON-text `config` and
`arguments`, the `error` field, streams that end at `end_of_stream`, the name
of the tool called in the `tool` property), bounds what one answer may bring
in (`CallLimits.max_answer_bytes`), and counts the calls in flight, so a hot reload can retire a
client without cutting a call in half.

A service whose config carries `answer-key` has its answers checked: one its
key did not sign (another process answering on its queues) is dropped,
counted (`toolreg_bridge_dropped_answers`) and logged, and the call waits on
for the genuine answer.

A call that ends early (its timeout, too large an answer, or a caller that
leaves the stream) tells the service at once, which stops the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping
from contextlib import aclosing
from typing import Any, Self

from toolservice_base import tracing
from toolservice_base.errors import AnswerTooLarge, ToolError
from toolservice_base.logs import get_logger
from toolservice_base.rpc import DEFAULT_LIMITS, TOOL, CallLimits, RequestClient
from toolservice_base.schemas import (
    TextContent,
    ToolResult,
    ToolServiceDescriptor,
    ToolServiceResponse,
    is_last_response,
    parse_response,
    plain_text,
    request_bytes,
)
from toolservice_base.signing import parse_public_key, public_key_text
from toolservice_base.tasks import wait_event
from toolservice_base.transport import Transport

from .metrics import BridgeMetrics

log = get_logger("agent_bridge.client")


class ToolServiceClient:
    """Request/response with one tool service, shared by every tool it serves."""

    def __init__(
        self, connection: Transport, service: ToolServiceDescriptor, metrics: BridgeMetrics | None = None
    ) -> None:
        self._metrics = metrics
        self._rpc = RequestClient(
            connection,
            service.request_queue,
            service.response_queue,
            name=f"bridge-{service.id}",
            cancels=True,
            on_dropped=self._dropped,
        )
        self.service = service
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    @property
    def service(self) -> ToolServiceDescriptor:
        return self._service

    @service.setter
    def service(self, service: ToolServiceDescriptor) -> None:
        """A reload may hand a live client the service's new item (same id and queues): its `answer-key` goes with
        it, so answers are checked against the key the registry accepted last."""
        self._service = service
        key = service.answer_key
        if key != (None if self._rpc.answer_key is None else public_key_text(self._rpc.answer_key)):
            self._rpc.answer_key = None if key is None else parse_public_key(key)

    def _dropped(self, request_id: str, why: str) -> None:
        """An answer on the service's queues its key did not sign: counted; the call waits for the genuine one, and
        nothing is held against the service (its own answers were not the ones dropped)."""
        (self._metrics or BridgeMetrics.default()).answer_dropped(self._service.id, why)

    def __repr__(self) -> str:
        return f"<ToolServiceClient {self.service.id} in_flight={self._in_flight}{' closed' if self._closed else ''}>"

    @property
    def in_flight(self) -> int:
        """Calls started and not yet finished (answered, failed or timed out)."""
        return self._in_flight

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self) -> ToolServiceClient:
        """Subscribe and open the producer now, so the first call pays no set-up."""
        await self._rpc.start()
        if self._closed:  # closed while it was starting: close what the start just opened
            await self._rpc.close()
        return self

    async def call(
        self,
        user: str,
        config: Mapping[str, Any],
        arguments: Mapping[str, Any],
        limits: CallLimits | float = DEFAULT_LIMITS,
        *,
        tool: str = "",
    ) -> str:
        """The whole observation: a streamed answer's chunks joined in order, with nothing between them.

        Taken response by response as they arrive (`RequestClient.exchange`), not through `stream`'s generators.
        """
        chunks: list[str] = []
        await self._exchange(user, config, arguments, limits, tool, chunks.append)
        return "".join(chunks)

    async def stream(
        self,
        user: str,
        config: Mapping[str, Any],
        arguments: Mapping[str, Any],
        limits: CallLimits | float = DEFAULT_LIMITS,
        *,
        tool: str = "",
    ) -> AsyncGenerator[str, None]:
        """Yield each non-empty chunk in order until the service says `end_of_stream`.

        `limits.timeout` bounds the whole call, however steadily a stream moves;
        `limits.idle_timeout`, if given, bounds each wait for the next chunk
        (both raise `RequestTimeout`). Past `limits.max_answer_bytes` of answer,
        `AnswerTooLarge`. A number for `limits` is the whole call's timeout
        (`CallLimits.of`).
        `tool` names the tool called, for a service that serves several (the
        service also counts and traces per tool); with an OpenTelemetry SDK
        configured, the call is a client span. A rich answer's chunks are the
        text renderings the service sent with it.
        """
        bodies = self._bodies(user, config, arguments, limits, tool)
        async with aclosing(bodies) as each:
            async for body, checked in each:
                text = checked.text(body)
                if text:
                    yield text

    async def parts(
        self,
        user: str,
        config: Mapping[str, Any],
        arguments: Mapping[str, Any],
        limits: CallLimits | float = DEFAULT_LIMITS,
        *,
        tool: str = "",
    ) -> AsyncGenerator[ToolResult, None]:
        """Like `stream`, as `ToolResult`s: each response's content blocks and structured content, or its text as
        one text block; empty responses skipped."""
        responses = self._bodies(user, config, arguments, limits, tool)
        async with aclosing(responses) as each:
            async for body, checked in each:
                part = checked.part(body)
                if part.content or part.structured is not None:
                    yield part

    async def responses(
        self,
        user: str,
        config: Mapping[str, Any],
        arguments: Mapping[str, Any],
        limits: CallLimits | float = DEFAULT_LIMITS,
        *,
        tool: str = "",
    ) -> AsyncGenerator[ToolServiceResponse, None]:
        """Every response to one call, checked (an error answer raises `ToolError`), until the last; bounded by
        `limits` as `stream` says."""
        bodies = self._bodies(user, config, arguments, limits, tool)
        async with aclosing(bodies) as each:
            async for body, checked in each:
                yield checked(body)

    async def _bodies(
        self,
        user: str,
        config: Mapping[str, Any],
        arguments: Mapping[str, Any],
        limits: CallLimits | float,
        tool: str,
    ) -> AsyncGenerator[tuple[dict[str, Any], _Checked], None]:
        """Every response to one call as the JSON it came as, with the call's check to read it by (`_Checked`: its
        text, its part, or the whole response), until the last."""
        limits = CallLimits.of(limits)
        request = self._request(user, config, arguments)
        # Counted before the first await: a reload that swaps this client out in
        # the same moment still sees the call and waits for it.
        self._begin()
        try:
            with tracing.client_call(tool, self.service.id) as span:
                # span.properties: the `tool` property when named, and the span's `traceparent` when tracing
                responses = self._rpc.stream(
                    request,
                    is_last=is_last_response,
                    limits=limits,
                    properties=span.properties or None,
                )
                checked = _Checked(self.service.id, limits.max_answer_bytes, tool)
                async with aclosing(responses) as bodies:
                    async for body in bodies:
                        yield body, checked
        finally:
            self._end()

    async def _exchange(
        self,
        user: str,
        config: Mapping[str, Any],
        arguments: Mapping[str, Any],
        limits: CallLimits | float,
        tool: str,
        take: Callable[[str], None],
    ) -> None:
        """`responses`, the text of each checked response handed to `take` as it arrives (if it has any)."""
        limits = CallLimits.of(limits)
        request = self._request(user, config, arguments)
        self._begin()
        try:
            checked = _Checked(self.service.id, limits.max_answer_bytes, tool)

            def each(body: dict[str, Any]) -> None:
                text = checked.text(body)
                if text:
                    take(text)

            if tracing.tracer() is None:  # no span to open and close: the `tool` property is all the call carries
                await self._rpc_exchange(request, each, limits, {TOOL: tool} if tool else None)
                return
            with tracing.client_call(tool, self.service.id) as span:
                await self._rpc_exchange(request, each, limits, span.properties or None)
        finally:
            self._end()

    def _rpc_exchange(
        self,
        request: bytes,
        each: Callable[[dict[str, Any]], None],
        limits: CallLimits,
        properties: dict[str, str] | None,
    ) -> Coroutine[Any, Any, None]:
        return self._rpc.exchange(
            request,
            each,
            is_last=is_last_response,
            limits=limits,
            properties=properties,
        )

    def _request(self, user: str, config: Mapping[str, Any], arguments: Mapping[str, Any]) -> bytes:
        """The request's bytes (`ToolServiceRequest` on the wire), or `ToolError` if it cannot be sent."""
        if self._closed:
            raise ToolError(
                "client-closed",
                f"the client of tool service {self.service.id!r} is closed (the service was removed or changed); "
                "call the tool through the ToolSet again",
            )
        try:
            return request_bytes(user, config, arguments)
        except (TypeError, ValueError) as exc:
            raise ToolError("bad-arguments", f"arguments must be JSON values: {exc}", service=self.service.id) from None

    def _begin(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def _end(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def close_when_idle(self, timeout: float | None = None) -> None:
        """Close once no call is in flight; after `timeout` seconds, close anyway."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._in_flight and not self._closed:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                log.warning("client.close_forced", service=self.service.id, in_flight=self._in_flight)
                break
            await wait_event(self._idle, remaining)
        await self.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close now. Calls still in flight end with `RequestTimeout`; prefer `close_when_idle`."""
        if self._closed:
            return
        self._closed = True
        await self._rpc.close()
        log.debug("client.closed", service=self.service.id)


class _Checked:
    """One call's responses, each parsed and checked (`ToolError` for an error answer), and counted against the
    call's `max_answer_bytes` (`AnswerTooLarge` past it)."""

    __slots__ = ("_service", "_limit", "_tool", "_size")

    def __init__(self, service: str, limit: int, tool: str) -> None:
        self._service, self._limit, self._tool = service, limit, tool
        self._size = 0

    def __call__(self, body: dict[str, Any]) -> ToolServiceResponse:
        response = parse_response(body, self._service)
        self._count(_weight(response))
        return response

    def text(self, body: dict[str, Any]) -> str:
        """What the response adds to the observation: its text. A plain text answer is read without its model."""
        text = self._plain(body)
        return self(body).response if text is None else text

    def part(self, body: dict[str, Any]) -> ToolResult:
        """What the response adds to the call's result (`ToolServiceResponse.result`); a plain text answer is read
        without its model, as `text` reads it."""
        text = self._plain(body)
        if text is None:
            return self(body).result()
        return ToolResult(content=(TextContent(text=text),)) if text else ToolResult()

    def _plain(self, body: dict[str, Any]) -> str | None:
        """A plain text answer's text, counted; None for any other response (read through its model)."""
        text = plain_text(body)
        if text is not None:
            self._count(len(text) if text.isascii() else len(text.encode()))
        return text

    def _count(self, size: int) -> None:
        self._size += size
        if self._size > self._limit:
            raise AnswerTooLarge(self._limit, tool=self._tool, service=self._service)


def _weight(response: ToolServiceResponse) -> int:
    """What a response brings in, for `max_bytes`: its text (UTF-8), and its blocks and structured content."""
    text = response.response
    size = len(text) if text.isascii() else len(text.encode())
    if response.content is not None or response.structured is not None:
        size += response.result().size
    return size

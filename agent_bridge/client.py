"""`ToolServiceClient`: calls to one tool service over its request/response queues.

`toolservice_base.rpc.RequestClient` already does the Pulsar part (subscribe to
the response queue before the first send, correlate on the `id` property, bound
each wait). This adds the tool-service protocol on top (JSON-text `config` and
`arguments`, the `error` field, streams that end at `end_of_stream`) and counts
the calls in flight, so a hot reload can retire a client without cutting a call
in half.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

from toolservice_base import tracing
from toolservice_base.errors import ToolError
from toolservice_base.logs import get_logger
from toolservice_base.rpc import RequestClient
from toolservice_base.schemas import ToolServiceDescriptor, ToolServiceRequest, is_last_response, response_chunk
from toolservice_base.transport import Transport

log = get_logger("agent_bridge.client")

DEFAULT_CALL_TIMEOUT = 30.0


class ToolServiceClient:
    """Request/response with one tool service, shared by every tool it serves."""

    def __init__(self, connection: Transport, service: ToolServiceDescriptor) -> None:
        self.service = service
        self._rpc = RequestClient(connection, service.request_queue, service.response_queue, name=f"bridge-{service.id}")
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

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
        timeout: float = DEFAULT_CALL_TIMEOUT,
        *,
        tool: str = "",
    ) -> str:
        """The whole observation: a streamed answer is concatenated."""
        async with aclosing(self.stream(user, config, arguments, timeout=timeout, tool=tool)) as chunks:
            return "".join([chunk async for chunk in chunks])

    async def stream(
        self,
        user: str,
        config: Mapping[str, Any],
        arguments: Mapping[str, Any],
        timeout: float = DEFAULT_CALL_TIMEOUT,
        *,
        tool: str = "",
    ) -> AsyncGenerator[str, None]:
        """Yield each non-empty chunk in order until the service says `end_of_stream`.

        `timeout` bounds the wait for each next response, so a long stream that
        keeps moving never times out and a stalled one raises `RequestTimeout`.
        `tool` names the tool called (the service counts and traces per tool);
        with an OpenTelemetry SDK configured, the call is a client span.
        """
        if self._closed:
            raise ToolError(
                "client-closed",
                f"the client of tool service {self.service.id!r} is closed (the service was removed or changed); "
                "call the tool through the ToolSet again",
            )
        try:
            request = ToolServiceRequest(user=user, config=json.dumps(dict(config)), arguments=json.dumps(dict(arguments)))
        except (TypeError, ValueError) as exc:
            raise ToolError("bad-arguments", f"arguments must be JSON values: {exc}", service=self.service.id) from None
        # Counted before the first await: a reload that swaps this client out in
        # the same moment still sees the call and waits for it.
        self._in_flight += 1
        self._idle.clear()
        try:
            with tracing.client_call(tool, self.service.id) as span:
                responses = self._rpc.stream(request, is_last=is_last_response, timeout=timeout, properties=span.properties)
                async with aclosing(responses) as bodies:
                    async for body in bodies:
                        chunk = response_chunk(body, self.service.id)
                        if chunk:
                            yield chunk
        finally:
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
            try:
                await asyncio.wait_for(self._idle.wait(), remaining)
            except TimeoutError:
                continue
        await self.close()

    async def close(self) -> None:
        """Close now. Calls still in flight end with `RequestTimeout`; prefer `close_when_idle`."""
        if self._closed:
            return
        self._closed = True
        await self._rpc.close()
        log.debug("client.closed", service=self.service.id)

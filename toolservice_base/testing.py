"""Test your own tool service with no broker: `ServiceHarness`.

    from toolservice_base.testing import ServiceHarness
    from toolservice_base.examples.countdown import CountdownService
    from toolservice_base.examples.joke import JokeService

    async with ServiceHarness(JokeService) as h:
        assert "cats" in await h.invoke("tell-joke", {"topic": "cats"})
    async with ServiceHarness(CountdownService) as h:
        chunks = [c async for c in h.stream("countdown", {"start": 3})]

In a pytest test, that needs pytest-asyncio (`pip install 'tool-discovery[testing]'`) and the test marked
`@pytest.mark.asyncio` (or `asyncio_mode = "auto"`); docs/guide/tool-authors.md has a complete test file.

The harness runs the service on the in-memory transport and calls it through
the real request path: a `ToolServiceRequest` with the tool's config values
and your arguments, the `id` property, the service's own request handling,
its responses parsed exactly as an agent parses them, the tool's name in the
request as the agent bridge sends it (for an `invoke` that takes `tool`). A service that raises
comes back as `ToolError` with the service's error type and message. The
class's `descriptor` and `tools` are validated exactly as `toolreg serve`
validates them, so a bad definition fails here first (`ServiceDefinitionError`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from contextlib import AsyncExitStack, aclosing
from pathlib import Path
from typing import Any, Generic, TypeVar

from .errors import UnknownToolError
from .rpc import TOOL, CallLimits, RequestClient
from .schemas import ToolDescriptor, ToolServiceRequest, is_last_response, response_chunk
from .service import DynamicToolService
from .settings import Settings
from .transport import MemoryBroker

S = TypeVar("S", bound=DynamicToolService)

DEFAULT_TIMEOUT = 5.0


class ServiceHarness(Generic[S]):
    """One instance of `service_class`, served on an in-memory broker for the length of an `async with`."""

    def __init__(
        self,
        service_class: type[S],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        drop: float = 0.0,
        **service_options: Any,
    ) -> None:
        """`timeout` bounds each whole call; `service_options` go to the service's constructor (e.g. `workspace=`,
        `call_timeout=`); `drop` loses that share of messages."""
        self.service_class = service_class
        self.timeout = timeout
        self._broker = MemoryBroker(drop=drop)
        self._options = service_options
        self._stack = AsyncExitStack()
        self._client: RequestClient | None = None
        self._service: S | None = None

    @property
    def service(self) -> S:
        """The running service instance (to inspect its state in a test)."""
        if self._service is None:
            raise RuntimeError("the harness is not running; use `async with ServiceHarness(...) as h`")
        return self._service

    @property
    def tools(self) -> dict[str, ToolDescriptor]:
        return {tool.name: tool for tool in self.service.tool_descriptors}

    async def __aenter__(self) -> "ServiceHarness[S]":
        async with AsyncExitStack() as stack:
            settings = Settings(data_dir=Path(".toolreg"), pulsar_url=self._broker.url)
            service = self.service_class(settings=settings, announce=False, **self._options)
            await service.start()
            stack.push_async_callback(service.stop, self.timeout)  # calls still running are cut after `timeout`
            transport = self._broker.transport(settings.topics)
            stack.push_async_callback(transport.close)
            descriptor = service.service_descriptor
            client = RequestClient(
                transport, descriptor.request_queue, descriptor.response_queue, name="harness", cancels=True
            )
            await client.start()
            stack.push_async_callback(client.close)
            self._service, self._client = service, client
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()
        self._service = self._client = None

    async def invoke(self, tool: str, arguments: Mapping[str, Any] | None = None, *, user: str = "") -> str:
        """The whole observation, as an agent gets it (a streamed answer joined)."""
        async with aclosing(self.stream(tool, arguments, user=user)) as chunks:
            return "".join([chunk async for chunk in chunks])

    async def stream(
        self, tool: str, arguments: Mapping[str, Any] | None = None, *, user: str = ""
    ) -> AsyncGenerator[str, None]:
        """Each non-empty chunk of the answer, in order."""
        if self._client is None:
            raise RuntimeError("the harness is not running; use `async with ServiceHarness(...) as h`")
        descriptor = self.tools.get(tool)
        if descriptor is None:
            raise UnknownToolError(f"{self.service.id!r} has no tool {tool!r}; it has: {', '.join(sorted(self.tools))}")
        request = ToolServiceRequest(
            user=user, config=json.dumps(descriptor.config_values), arguments=json.dumps(dict(arguments or {}))
        )
        responses = self._client.stream(
            request, is_last=is_last_response, limits=CallLimits(self.timeout), properties={TOOL: tool}
        )
        async with aclosing(responses) as bodies:
            async for body in bodies:
                chunk = response_chunk(body, self.service.id)
                if chunk:
                    yield chunk

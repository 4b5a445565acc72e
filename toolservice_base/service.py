"""`DynamicToolService`: write `invoke`, get a tool service that announces itself.

An author declares the service and its tools as spec JSON and overrides
`invoke`:

    class JokeService(DynamicToolService):
        descriptor = {"id": "joke-service", "config-params": [{"name": "style"}]}
        tools = [{"name": "tell-joke", "description": "...", "arguments": [...]}]

        async def invoke(self, user, config, arguments):
            return f"A {config.get('style', 'plain')} joke about {arguments['topic']}"

A service that serves several tools learns which one was called by accepting
a `tool` keyword: `async def invoke(self, user, config, arguments, *, tool="")`.

A tool may also declare what MCP says of a tool: `title`, `annotations`
(`{"readOnlyHint": true}`), `input-schema` (a JSON Schema dict, a pydantic
model, a dataclass, a TypedDict or a function whose type hints are the
arguments; its flat `arguments` are then derived) and `output-schema`.
Arguments are checked against a declared input schema before `invoke` runs
(a `bad-arguments` answer naming the path of the first violation). `invoke`
may return rich results: a `ToolResult`, a content block (`ImageContent.of(
png, "image/png")`, ...) or a list of them, and, for a tool with an output
schema, a dict that is its structured content; each response then carries
them beside a text rendering, which is all a TrustGraph agent reads.

Every call has a deadline: the caller's timeout (it travels with the request)
or the service's own limit, `call_timeout` or a tool's entry in
`tool_timeouts`, whichever comes first. At the deadline `invoke` is cancelled.

Queues left out of `descriptor` default to `non-persistent://<topicspace>/request/<id>`
and `non-persistent://<topicspace>/response/<id>` (topicspace `tg` unless
`TOOLREG_TOPICSPACE` says otherwise); `type` and `service` left out of a tool
default to `tool-service` and the service's id (`declaration` fills and checks what
the author declared; this module serves it).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import signal
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, ClassVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from toolservice_base.rpc.answers import past_deadline
from toolservice_base.rpc.server import RequestServer
from toolservice_base.rpc.wire import TOOL

from . import tracing
from .announcer import Announcer, new_instance_id
from .call_stats import CallStats
from .declaration import build_descriptors, call_limits
from .errors import BadRequest, ToolError
from .logs import get_logger
from .metrics import OTHER_TOOL, ServiceMetrics
from .results import response_for, stream_responses
from .schemas import (
    DEFAULT_TTL,
    MAX_REQUEST_BYTES,
    ErrorBody,
    ToolDescriptor,
    ToolServiceResponse,
    describe_validation_error,
    request_fields,
    text_response_bytes,
)
from .settings import Settings
from .signing import answer_signer, load_private_key
from .tasks import gather_or_raise
from .tool_contract import ToolContract
from .tool_labels import ToolLabels
from .topics import DEFAULT as DEFAULT_TOPICS
from .transport import Envelope, Transport, open_transport

log = get_logger("toolservice_base.service")


DEFAULT_CALL_TIMEOUT = 120.0
"""Seconds one call may run when its caller does not say how long it waits (a TrustGraph agent, say)."""


def _parse_request(data: bytes, max_bytes: int = MAX_REQUEST_BYTES) -> tuple[str, dict[str, Any], dict[str, Any]]:
    if len(data) > max_bytes:
        raise BadRequest(f"request is {len(data)} bytes; the limit is {max_bytes}")
    try:
        user, config, arguments = request_fields(data)
    except ValidationError as exc:
        raise BadRequest(f"request is not a ToolServiceRequest: {describe_validation_error(exc)}") from None
    return user, _json_object("config", config), _json_object("arguments", arguments)


def _json_object(field: str, text: str) -> dict[str, Any]:
    if not text or text == "{}":  # a tool without config values sends this on every call
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"request field '{field}' is not JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise BadRequest(f"request field '{field}' is nested too deeply") from None
    if not isinstance(value, dict):
        raise BadRequest(f"request field '{field}' must be a JSON object, got {type(value).__name__}")
    return value


def _takes_tool(invoke: Callable[..., Any]) -> bool:
    """Whether an `invoke` override accepts the `tool` keyword (by name, or through **kwargs)."""
    try:
        parameters = inspect.signature(invoke).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "tool" and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
        for p in parameters
    )


class DynamicToolService:
    """Base class of every tool service. Override `invoke`."""

    descriptor: ClassVar[dict[str, Any]] = {}
    tools: ClassVar[list[dict[str, Any]]] = []
    ttl: ClassVar[float] = DEFAULT_TTL
    announce: ClassVar[bool] = True
    workspace: ClassVar[str] = "default"
    version: ClassVar[str] = ""
    max_in_flight: ClassVar[int] = 64
    max_backlog: ClassVar[int] = 256
    """Requests that may wait for a slot; past that, a request is answered `busy` at once."""
    call_timeout: ClassVar[float] = DEFAULT_CALL_TIMEOUT
    """The longest one call may run, in seconds, whatever its caller would wait (then it is answered `timeout`)."""
    tool_timeouts: ClassVar[dict[str, float]] = {}
    """Per-tool limits that replace `call_timeout` for the tools they name."""
    max_request_bytes: ClassVar[int] = MAX_REQUEST_BYTES
    """Larger requests are answered `bad-request` unread: one caller cannot make an instance parse megabytes."""

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        connection: Transport | None = None,
        ttl: float | None = None,
        announce: bool | None = None,
        workspace: str | None = None,
        signing_key: Ed25519PrivateKey | str | Path | None = None,
        metrics: ServiceMetrics | None = None,
        call_timeout: float | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        topics = connection.topics if connection is not None else self.settings.topics
        self.service_descriptor, self.tool_descriptors = build_descriptors(
            type(self).descriptor, type(self).tools, topics
        )
        self.call_limit = float(call_timeout if call_timeout is not None else type(self).call_timeout)
        self.__pass_tool = _takes_tool(self.invoke)
        self._connection = connection
        self._own_connection = connection is None
        self.lease_ttl = float(ttl if ttl is not None else type(self).ttl)
        self.announcing = type(self).announce if announce is None else announce
        self.lease_workspace = workspace or type(self).workspace
        key_source = signing_key if signing_key is not None else self.settings.signing_key_file
        self.signing_key = load_private_key(key_source) if isinstance(key_source, (str, Path)) else key_source
        self._instance = new_instance_id(self.id)
        self.__metrics = metrics or ServiceMetrics.default()
        self.call_stats = CallStats(())
        """Calls, errors and latencies per tool since the last heartbeat, which carries them to the registry page."""
        self.__take(self.tool_descriptors)
        self._server: RequestServer | None = None
        self.announcer: Announcer | None = None
        self._stopped = asyncio.Event()
        self._stopping = False
        self._resources = AsyncExitStack()

    def __take(self, tools: list[ToolDescriptor]) -> None:
        """Serve `tools` from now on: what each call is checked against, labelled and limited by."""
        self.tool_limits = call_limits(self.id, self.call_limit, type(self).tool_timeouts, tools)
        self.tool_descriptors = tools
        # A request without a `tool` property (a TrustGraph agent, an older bridge) is for the only tool, if there is
        # one.
        self.__only_tool = tools[0].name if len(tools) == 1 else ""
        self._labels = ToolLabels(tools)
        self.__contracts = {
            tool.name: ToolContract(tool)
            for tool in tools
            if tool.input_schema is not None or tool.output_schema is not None
        }
        """Tools that declared a schema: their arguments are checked before `invoke`, their structured results after."""
        self.__checks_input = {tool.name for tool in tools if tool.input_schema is not None}
        self.metrics = self.__metrics.bind(self.id, self._labels.names)
        self.call_stats.track(self._labels.names)

    async def offer(self, tools: list[dict[str, Any]]) -> None:
        """Offer other tools from now on (a service whose tools change as it runs): checked as the class's `tools`
        are, served at once, and announced; the registry takes it as a change of definitions, held where pinned."""
        _, descriptors = build_descriptors(self.service_descriptor.to_wire(), tools, DEFAULT_TOPICS)
        self.__take(descriptors)
        if self.announcer is not None:
            await self.announcer.offer(descriptors)

    @property
    def id(self) -> str:
        return self.service_descriptor.id

    @property
    def instance(self) -> str:
        """This instance's id: in its announcements, and on its spans. Fresh per process; the announcer
        takes a fresh one when the registry shows another sender took this one over (`announcer`)."""
        return self.announcer.instance if self.announcer is not None else self._instance

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        """Answer one call: override as `async def` returning a value, or as an async generator to stream.

        Declared plain (not `async def`) so both kinds of override type-check.
        An override that also takes a `tool` keyword (`*, tool: str = ""`) is
        told the name of the tool called: the name the caller knows it by, or
        "" if the caller did not say and the service has several tools.
        """
        raise NotImplementedError(f"{type(self).__name__} must override invoke(user, config, arguments)")

    def readiness(self) -> str | None:
        """None while the service takes requests (subscribed, broker connected); else why not. For `/readyz`."""
        if self._stopping:
            return "stopping"
        if self._server is None:
            return "not started"
        if not self._server.connected:
            service = self.service_descriptor
            problem = self._why_not(service.request_queue) or self._why_not(service.response_queue)
            return problem or f"not connected to the broker for {service.request_queue}"
        return None

    def _why_not(self, queue: str) -> str | None:
        """What the transport found the broker says of `queue` (a revoked grant, an expired token), in one line."""
        return None if self._connection is None else self._connection.problem(queue)

    def tool_called(self, message: Envelope) -> str:
        """The tool a request is for: its `tool` property, or the service's only tool; "" if neither."""
        return message.properties.get(TOOL) or self.__only_tool

    def __limit(self, message: Envelope) -> float:
        return self.tool_limits.get(self.tool_called(message), self.call_limit)

    async def __handle(self, message: Envelope, reply: Any) -> None:
        """One request, inside its server span (the caller's span as parent) when tracing; with no span at all when
        not."""
        tool = self._labels.of(message.properties)
        if tracing.tracer() is None:
            await self.__serve(message, reply, tool, None)
            return
        with tracing.server_call(message.properties, tool, self.id, self.instance) as span:
            await self.__serve(message, reply, tool, span)

    async def __serve(self, message: Envelope, reply: Any, tool: str, span: Any) -> None:
        started = time.perf_counter()
        error: str | None = None
        error_type: str | None = None
        try:
            user, config, arguments = _parse_request(message.data, type(self).max_request_bytes)
            if tool == OTHER_TOOL and TOOL not in message.properties:
                tool = self._labels.of(message.properties, config)  # a caller that does not name it: its config may
                if span is not None:
                    span.set("tool.name", tool)
                    span.rename(f"serve {tool}")
            await self.__invoke(message, reply, user, config, arguments)
        except BadRequest as exc:
            error = "bad-request"
            log.warning("request.rejected", service=self.id, reason=str(exc))
            await reply(ToolServiceResponse(error=ErrorBody(type="bad-request", message=str(exc)), end_of_stream=True))
        except ToolError as exc:  # arguments that break the input schema, a result that breaks the output schema
            error, error_type = "exception", exc.type
            log.info("invoke.refused", service=self.id, tool=tool, error=str(exc))
            await reply(ToolServiceResponse(error=ErrorBody(type=exc.type, message=exc.message), end_of_stream=True))
        except Exception as exc:
            error, error_type = "exception", type(exc).__name__
            log.warning("invoke.failed", service=self.id, error=f"{type(exc).__name__}: {exc}")
            await reply(
                ToolServiceResponse(error=ErrorBody(type=type(exc).__name__, message=str(exc)), end_of_stream=True)
            )
        except asyncio.CancelledError:
            error = "cancelled"  # a deadline, or the caller gave up; the request server answers if anyone waits
            error_type = "timeout" if past_deadline() else "cancelled"
            raise
        finally:
            # The metric counts deadlines and cancels as one kind; the span tells them apart.
            if span is not None:
                tracing.outcome(span, error_type if error == "cancelled" else error, error_type)
            took = time.perf_counter() - started
            self.metrics.observe(took, error, tool)
            self.call_stats.record(tool, took, error is not None)

    async def __invoke(
        self, message: Envelope, reply: Any, user: str, config: dict[str, Any], arguments: dict[str, Any]
    ) -> None:
        """Check the arguments against the tool's input schema, call `invoke`, and answer in the form it returned: a
        stream part by part, text as its bytes at once, anything else as a checked response. What it raises is for
        `__serve` to answer and count."""
        called = self.tool_called(message)
        contract = self.__contracts.get(called)
        if contract is not None and called in self.__checks_input:
            contract.check_arguments(arguments)
        if self.__pass_tool:
            result = self.invoke(user, config, arguments, tool=called)  # type: ignore[call-arg]
        else:
            result = self.invoke(user, config, arguments)
        if inspect.isawaitable(result):
            result = await result
        if inspect.isasyncgen(result):
            await stream_responses(result, reply, contract)
        elif isinstance(result, str):  # most answers: their bytes at once, no model built and dumped
            await reply(text_response_bytes(result))
        else:
            await reply(response_for(result, contract))

    async def start(self) -> None:
        """Subscribe to requests, then (and only then) announce.

        Each step registers its undo on an exit stack as it succeeds: if a
        later step fails, the earlier ones are undone (connection closed,
        subscription dropped) before the error reaches the caller.
        """
        async with AsyncExitStack() as stack:
            if self._connection is None:
                self._connection = await open_transport(self.settings)
                stack.push_async_callback(self._forget_connection)
            service = self.service_descriptor
            server = RequestServer(
                self._connection,
                service.request_queue,
                service.response_queue,
                self.__handle,
                subscription=service.id,
                max_in_flight=type(self).max_in_flight,
                max_backlog=type(self).max_backlog,
                cancellable=True,
                limit=self.__limit,
                sign_answer=None if self.signing_key is None else answer_signer(self.signing_key),
            )
            stack.push_async_callback(server.stop)  # safe after a start that failed half-way
            announcer = None
            if self.announcing:
                announcer = Announcer(
                    self._connection,
                    service,
                    self.tool_descriptors,
                    ttl=self.lease_ttl,
                    workspace=self.lease_workspace,
                    version=type(self).version,
                    signing_key=self.signing_key,
                    instance=self._instance,
                    stats=self.call_stats,
                )
                stack.push_async_callback(announcer.stop)  # withdraws only what it announced
            # The request queue and the announcer's topics open at once (a broker round trip each, saved);
            # nothing is announced until the service can take requests.
            await gather_or_raise(server.start(), *([announcer.open()] if announcer is not None else []))
            self._server = server
            log.info("service.listening", service=service.id, queue=service.request_queue)
            if announcer is not None:
                await announcer.announce()
                self.announcer = announcer
            self._resources = stack.pop_all()

    async def _forget_connection(self) -> None:
        if self._own_connection and self._connection is not None:
            connection, self._connection = self._connection, None
            await connection.close()

    async def stop(self, timeout: float = 30.0) -> None:
        """Withdraw, stop taking requests, finish the ones in flight, close."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        try:
            # Withdraw first, so the registry drops us before requests stop being taken.
            if self.announcer is not None:
                await self.announcer.withdraw()
            if self._server is not None:
                await self._server.stop(timeout)
            await self._resources.aclose()
        finally:
            log.info("service.stopped", service=self.id)
            self._stopped.set()

    async def run(self) -> None:
        """Start, serve until SIGTERM or SIGINT, then stop gracefully."""
        loop = asyncio.get_running_loop()
        stop_requested = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop_requested.set)
        try:
            await self.start()
            await stop_requested.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self.stop()

    async def __aenter__(self) -> "DynamicToolService":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

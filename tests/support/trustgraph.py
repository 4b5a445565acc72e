"""Real TrustGraph 2.11 code for the tests (imported as `trustgraph_support`): trustgraph-base from PyPI, unmodified.

A TrustGraph processor runs in the test's process against the test's broker
with three parameters: `id`, `pulsar_host` (TrustGraph's own Pulsar backend,
`trustgraph.base.async_pulsar_backend`) and `config_timeout`. It talks to
the config store on TrustGraph's own queue names (`request:tg:config` and so
on, mapped by its backend to `non-persistent://tg/...`), which are ours.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

from trustgraph.base import AsyncProcessor
from trustgraph.base import DynamicToolService as TrustGraphToolService
from trustgraph.base.tool_service_client import ToolServiceClientSpec

CONFIG_TIMEOUT = 5
"""TrustGraph sends a config request once and waits this long (its default is 60 s); then it retries after 2 s."""


class ToolWatcher(AsyncProcessor):
    """A stock TrustGraph processor with the agent's config handler (`types=["tool", "tool-service"]`).

    `on_tools_config` rebuilds a workspace's tools from exactly the config it
    is handed, as TrustGraph's agent does (trustgraph-flow
    `agent/react/service.py`): a `tool-service` tool whose service is not in
    that config fails the whole reload, and the workspace keeps its old tools.
    """

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.tools: dict[str, dict[str, dict[str, Any]]] = {}
        self.services: dict[str, dict[str, dict[str, Any]]] = {}
        self.calls: list[tuple[str, dict[str, dict[str, str]], int]] = []
        self.failures: list[str] = []
        self.changed = asyncio.Event()
        self.register_config_handler(self.on_tools_config, types=["tool", "tool-service"])

    async def on_tools_config(self, workspace: str, config: dict[str, dict[str, str]], version: int) -> None:
        self.calls.append((workspace, config, version))
        services = {key: json.loads(value) for key, value in config.get("tool-service", {}).items()}
        tools: dict[str, dict[str, Any]] = {}
        for value in config.get("tool", {}).values():
            data = json.loads(value)
            if data.get("type") == "tool-service" and data.get("service") not in services:
                self.failures.append(
                    f"{workspace}: tool {data.get('name')} references unknown tool-service {data.get('service')!r}"
                )
                self.changed.set()
                return
            tools[data["name"]] = data
        self.tools[workspace] = tools
        self.services[workspace] = services
        self.changed.set()

    def names(self, workspace: str = "default") -> set[str]:
        return set(self.tools.get(workspace, {}))


@asynccontextmanager
async def tool_watcher(url: str) -> AsyncIterator[ToolWatcher]:
    """A started `ToolWatcher`: its start-up config load has been handed to the handler."""
    processor = ToolWatcher(id=f"watcher-{uuid.uuid4().hex[:8]}", pulsar_host=url, config_timeout=CONFIG_TIMEOUT)
    try:
        await processor.start()
        yield processor
    finally:
        await processor.stop()


class ShoutService(TrustGraphToolService):
    """A stock TrustGraph tool service (its base class, its queues `request/<topic>`), knowing nothing of discovery."""

    async def invoke(self, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        text = str(arguments.get("text", ""))
        return text.upper() + str(config.get("suffix", "!"))


@asynccontextmanager
async def shout_service(url: str, topic: str) -> AsyncIterator[ShoutService]:
    service = ShoutService(
        id=f"shout-{uuid.uuid4().hex[:8]}", pulsar_host=url, topic=topic, config_timeout=CONFIG_TIMEOUT
    )
    try:
        await service.start()
        yield service
    finally:
        await service.stop()


async def trustgraph_tool_client(processor: AsyncProcessor, request_queue: str, response_queue: str) -> Any:
    """TrustGraph's `ToolServiceClient` on these queues, wired the way a TrustGraph flow wires one
    (`ToolServiceClientSpec.register`)."""
    spec = ToolServiceClientSpec(request_name="tool-request", response_name="tool-response")
    flow = SimpleNamespace(consumer={})
    definition = {"topics": {"tool-request": request_queue, "tool-response": response_queue}}
    return await spec.register(flow, processor, definition)

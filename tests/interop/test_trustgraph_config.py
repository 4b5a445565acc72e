"""The config store speaks TrustGraph 2.11's config protocol: asked by TrustGraph's own client, schema and serializer.

The requests here are built from trustgraph-base's dataclasses and sent by
its `RequestResponseClient` over its own Pulsar backend, so they are byte
for byte what a TrustGraph processor or its API gateway sends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import eventually
from support.trustgraph import CONFIG_TIMEOUT
from trustgraph.base import RequestResponseClient, get_async_pubsub
from trustgraph.schema import (
    ConfigKey,
    ConfigRequest,
    ConfigResponse,
    ConfigValue,
    config_request_queue,
    config_response_queue,
)

from discovery.broker import EmbeddedBroker
from discovery.store.service import ConfigStoreService
from discovery.store.workspace_queues import workspace_queues
from toolservice_base import ConfigClient, ConfigPush, RequestClient, Settings, Transport, topics, watch_config

SERVICE = {
    "id": "weather",
    "request-queue": topics.DEFAULT.request_queue("weather"),
    "response-queue": topics.DEFAULT.response_queue("weather"),
}
TOOL = {"type": "tool-service", "name": "forecast", "description": "The weather", "service": "weather"}


@pytest.fixture
async def backend(broker: EmbeddedBroker) -> AsyncIterator[Any]:
    pubsub = get_async_pubsub(pulsar_host=broker.url)
    yield pubsub
    await pubsub.close()


async def trustgraph_client(
    backend: Any, request_queue: str = config_request_queue, response_queue: str = config_response_queue
) -> Any:
    return await RequestResponseClient.create(
        backend=backend,
        request_topic=request_queue,
        response_topic=response_queue,
        request_schema=ConfigRequest,
        response_schema=ConfigResponse,
        default_timeout=CONFIG_TIMEOUT,
    )


async def until_receiving(connection: Transport, received: list[dict[str, Any]]) -> None:
    """Return once our notify subscription is seen to receive (a non-persistent topic drops what comes before); empties
    `received`."""
    publisher = await connection.publisher(topics.DEFAULT.config_notify)
    try:
        for _ in range(100):
            await publisher.send({"ready": True})
            try:
                await eventually(lambda: received, timeout=0.05)
                break
            except AssertionError:
                continue
    finally:
        await connection.close_publisher(publisher)
    await asyncio.sleep(0.1)
    received.clear()


async def put_tools(config: ConfigClient, workspace: str) -> None:
    await config.put(
        [("tool-service", "weather", json.dumps(SERVICE)), ("tool", "forecast", json.dumps(TOOL))], workspace=workspace
    )


async def test_the_cross_workspace_reads_trustgraph_starts_with(backend: Any, config_client: ConfigClient) -> None:
    await put_tools(config_client, "alpha")
    await put_tools(config_client, "beta")
    await config_client.put(
        [("tool", "forecast", json.dumps(TOOL)), ("tool-service", "weather", json.dumps(SERVICE))], workspace="_hidden"
    )
    client = await trustgraph_client(backend)
    try:
        keys = await client.request(ConfigRequest(operation="getkeys-all-ws", type="tool"))
        assert keys.error is None and keys.version == 3
        assert [(v.workspace, v.type, v.key, v.value) for v in keys.values] == [
            ("_hidden", "tool", "forecast", ""),
            ("alpha", "tool", "forecast", ""),
            ("beta", "tool", "forecast", ""),
        ]
        values = await client.request(ConfigRequest(operation="getvalues-all-ws", type="tool-service"))
        assert {v.workspace for v in values.values} == {"_hidden", "alpha", "beta"}
        assert all(json.loads(v.value) == SERVICE for v in values.values)
        one = await client.request(ConfigRequest(operation="getvalues", workspace="alpha", type="tool"))
        assert [(v.key, json.loads(v.value)["name"]) for v in one.values] == [("forecast", "forecast")]
    finally:
        await client.close()


async def test_trustgraph_writes_and_reads_one_workspace(backend: Any, config_client: ConfigClient) -> None:
    client = await trustgraph_client(backend)
    try:
        put = await client.request(
            ConfigRequest(
                operation="put",
                workspace="alpha",
                values=[
                    ConfigValue(type="tool-service", key="weather", value=json.dumps(SERVICE)),
                    ConfigValue(type="tool", key="forecast", value=json.dumps(TOOL)),
                ],
            )
        )
        assert put.error is None
        got = await client.request(
            ConfigRequest(operation="get", workspace="alpha", keys=[ConfigKey(type="tool", key="forecast")])
        )
        assert json.loads(got.values[0].value) == TOOL
        listed = await client.request(ConfigRequest(operation="list", workspace="alpha", type="tool"))
        assert listed.directory == ["forecast"]
        everything = await client.request(ConfigRequest(operation="config", workspace="alpha"))
        assert set(everything.config) == {"tool", "tool-service"} and everything.version == put.version == 1
        deleted = await client.request(
            ConfigRequest(operation="delete", workspace="alpha", keys=[ConfigKey(type="tool", key="forecast")])
        )
        assert deleted.error is None and await config_client.list("tool", workspace="alpha") == []
    finally:
        await client.close()


async def test_errors_carry_trustgraphs_types(backend: Any, config_client: ConfigClient) -> None:
    client = await trustgraph_client(backend)
    try:
        unknown = await client.request(ConfigRequest(operation="explode", workspace="alpha"))
        assert unknown.error.type == "bad-operation" and "explode" in unknown.error.message
        no_workspace = await client.request(
            ConfigRequest(operation="getvalues", type="tool")
        )  # TrustGraph sends workspace ""
        assert no_workspace.error.type == "bad-request" and "workspace" in no_workspace.error.message
    finally:
        await client.close()


async def test_answers_have_every_field_as_trustgraph_serializes_them_and_unknown_fields_are_ignored(
    connection: Transport, config_client: ConfigClient
) -> None:
    await put_tools(config_client, "alpha")
    raw = RequestClient(connection, topics.DEFAULT.config_request, topics.DEFAULT.config_response)
    try:
        body = await raw.request(
            {
                "operation": "getkeys-all-ws",
                "workspace": "",
                "type": "tool",
                "keys": [],
                "values": [],
                "flavour": "new in 2.12",
            },
            timeout=5,
        )
        assert body == {
            "version": 1,
            "directory": [],
            "config": {},
            "error": None,
            "values": [{"type": "tool", "key": "forecast", "value": "", "workspace": "alpha"}],
        }
        put = await raw.request(
            {
                "operation": "put",
                "workspace": "alpha",
                "keys": [],
                "type": "",
                "values": [{"type": "note", "key": "n", "value": "v", "workspace": "", "colour": "red"}],
            },
            timeout=5,
        )
        assert put == {"version": 2, "values": [], "directory": [], "config": {}, "error": None}
        error = await raw.request({"operation": "explode"}, timeout=5)
        assert set(error) == {"version", "values", "directory", "config", "error"} and set(error["error"]) == {
            "type",
            "message",
        }
    finally:
        await raw.close()


async def test_pushes_start_empty_name_both_tool_types_announce_workspaces_and_hide_reserved_ones(
    connection: Transport, settings: Settings
) -> None:
    raw: list[dict[str, Any]] = []

    async def on_push(message: Any) -> None:
        raw.append(json.loads(message.data))

    await connection.subscribe(topics.DEFAULT.config_notify, on_push)
    await until_receiving(connection, raw)
    store = ConfigStoreService.in_data_dir(connection, settings.data_dir)
    await store.start()
    client = await ConfigClient(connection, timeout=5).start()
    try:
        await eventually(lambda: raw)
        assert raw[0] == {
            "version": 0,
            "changes": {},
            "workspace_changes": None,
        }  # the start-up poke: everything may have changed
        await client.put([("tool-service", "weather", json.dumps(SERVICE))], workspace="alpha")
        await client.put([("note", "n", "v")], workspace="_private")  # reserved: stored, not announced at all
        await client.put([("note", "n", "v")], workspace="alpha")
        await client.delete([("tool-service", "weather"), ("note", "n")], workspace="alpha")
        await eventually(lambda: len(raw) == 4)
        assert raw[1] == {
            "version": 1,
            "changes": {"tool": ["alpha"], "tool-service": ["alpha"]},
            "workspace_changes": {"created": ["alpha"], "deleted": []},
        }
        assert raw[2] == {"version": 3, "changes": {"note": ["alpha"]}, "workspace_changes": None}
        assert raw[3] == {
            "version": 4,
            "changes": {"note": ["alpha"], "tool": ["alpha"], "tool-service": ["alpha"]},
            "workspace_changes": {"created": [], "deleted": ["alpha"]},
        }
        assert await client.get([("note", "n")], workspace="_private") == {("note", "n"): "v"}
    finally:
        await client.close()
        await store.stop()


async def test_trustgraphs_workspace_declarations_are_announced(
    connection: Transport, config_client: ConfigClient
) -> None:
    pushes: list[ConfigPush] = []

    async def on_push(push: ConfigPush) -> None:
        pushes.append(push)

    await watch_config(connection, on_push)
    await config_client.put([("workspace", "gamma", "{}")], workspace="__workspaces__")
    await config_client.put([("note", "n", "v")], workspace="gamma")  # declared already: not created again
    await config_client.delete([("workspace", "gamma")], workspace="__workspaces__")  # still has an item: not deleted
    await eventually(lambda: len(pushes) == 2)
    assert (
        pushes[0].changes == {}
        and pushes[0].workspace_changes is not None
        and pushes[0].workspace_changes.created == ["gamma"]
    )
    assert pushes[1].changes == {"note": ["gamma"]} and pushes[1].workspace_changes is None


async def test_each_workspace_is_answered_on_its_own_queue_as_trustgraphs_gateway_asks(
    backend: Any, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    await put_tools(config_client, "alpha")
    await eventually(lambda: "alpha" in config_store.workspace_queues)
    client = await trustgraph_client(backend, *workspace_queues(topics.DEFAULT, "alpha"))
    try:
        # The workspace comes from the queue; the body's is ignored, as TrustGraph's config service does.
        listed = await client.request(ConfigRequest(operation="list", workspace="beta", type="tool"))
        assert listed.error is None and listed.directory == ["forecast"]
        await client.request(ConfigRequest(operation="put", values=[ConfigValue(type="note", key="n", value="v")]))
        assert await config_client.get([("note", "n")], workspace="alpha") == {("note", "n"): "v"}
        cross = await client.request(ConfigRequest(operation="getvalues-all-ws", type="tool"))
        assert cross.error.type == "bad-operation"
    finally:
        await client.close()
    await put_tools(config_client, "fresh")  # a workspace that appears later gets its queue
    await eventually(lambda: "fresh" in config_store.workspace_queues)
    fresh = await trustgraph_client(backend, *workspace_queues(topics.DEFAULT, "fresh"))
    try:
        assert (await fresh.request(ConfigRequest(operation="list", type="tool-service"))).directory == ["weather"]
    finally:
        await fresh.close()
    await config_client.delete([("tool", "forecast"), ("tool-service", "weather")], workspace="fresh")
    await eventually(lambda: "fresh" not in config_store.workspace_queues)


async def test_a_flow_processors_own_config_type_is_stored_and_read_across_workspaces(
    backend: Any, config_client: ConfigClient
) -> None:
    """TrustGraph's flow processors keep their flows under `processor:<id>` and load it with getkeys-all-ws at start."""
    await config_client.put([("processor:kg-extract", "flow-a", '{"topics": {}}')], workspace="alpha")
    client = await trustgraph_client(backend)
    try:
        keys = await client.request(ConfigRequest(operation="getkeys-all-ws", type="processor:kg-extract"))
        assert keys.error is None and [(v.workspace, v.key) for v in keys.values] == [("alpha", "flow-a")]
    finally:
        await client.close()

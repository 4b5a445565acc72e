"""Big stores and big answers: no read, listing or answer depends on everything fitting in one message.

The broker takes about 5 MiB in one message. Readers ask only for the types
they need, in pages read at one version; an item the store could not give
back in one answer is refused when it is written; an answer too large to send
is replaced by an error the caller gets at once, not by silence.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support import static_items
from support.big_store import BLOB_BYTES, SERVICE, put_blobs, put_tools, tool

from agent_bridge import ToolError, ToolSet
from discovery.registry.client import RegistryClient
from discovery.store.operations import ConfigOperations, Outcome
from discovery.store.service import ConfigStoreService
from discovery.store.sqlite import ConfigStore
from toolservice_base import ConfigClient, ConfigError, ConfigRefused, DynamicToolService, Settings, Transport
from toolservice_base.rpc import RequestClient
from toolservice_base.schemas import MAX_ITEM_BYTES, PAGE_BYTES, ConfigRequest

pytestmark = pytest.mark.contract

TRUSTGRAPH_FIELDS = {"version", "values", "directory", "config", "error"}


async def raw(connection: Transport, body: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
    """One request to the store as any client writes it, our client's checks bypassed."""
    client = RequestClient(
        connection, connection.topics.config_request, connection.topics.config_response, name="raw", bulk=True
    )
    await client.start()
    try:
        return await client.request(body, timeout=timeout)
    finally:
        await client.close()


async def test_getvalues_and_list_come_in_pages_in_key_order_and_whole_without_page_fields(
    connection: Transport, config_client: ConfigClient
) -> None:
    await put_tools(config_client, 25)
    first = await raw(connection, {"operation": "getvalues", "type": "tool", "limit": 10})
    assert [v["key"] for v in first["values"]] == [f"t-{n:05d}" for n in range(10)] and first["more"] is True
    last = await raw(connection, {"operation": "list", "type": "tool", "limit": 10, "after": "t-00019"})
    assert last["directory"] == [f"t-{n:05d}" for n in range(20, 25)] and last["more"] is False
    whole = await raw(connection, {"operation": "getvalues", "workspace": "default", "type": "tool"})
    assert set(whole) == TRUSTGRAPH_FIELDS  # a reader that does not page (TrustGraph) gets today's answer, no `more`
    assert len(whole["values"]) == 25
    config_client.page_limit = 7
    assert list(await config_client.getvalues("tool")) == [f"t-{n:05d}" for n in range(25)]
    assert await config_client.list("tool") == [f"t-{n:05d}" for n in range(25)]


async def test_a_page_stops_at_its_byte_budget_but_always_carries_one_item(
    connection: Transport, config_client: ConfigClient
) -> None:
    await put_blobs(config_client, 2)
    await config_client.put([("blob", "small", "s")])
    page = await raw(connection, {"operation": "getvalues", "type": "blob", "limit": 100})
    assert [v["key"] for v in page["values"]] == ["b0"] and page[
        "more"
    ] is True  # 3.5 MB is over PAGE_BYTES: alone on its page
    assert BLOB_BYTES > PAGE_BYTES
    blobs = await config_client.getvalues("blob")
    assert sorted(blobs) == ["b0", "b1", "small"] and blobs["b1"] == "b" * BLOB_BYTES


async def test_a_read_starts_over_when_a_write_lands_between_its_pages(
    config_store: ConfigStoreService, config_client: ConfigClient
) -> None:
    await config_client.put([("prompt", f"p{n:02d}", "old") for n in range(30)])
    served: list[int] = []
    execute = config_store.operations.execute

    def execute_then_write_once(request: ConfigRequest, queue_workspace: str | None = None) -> Outcome:
        outcome = execute(request, queue_workspace)
        if request.operation == "getvalues":
            served.append(outcome.response.version)
            if len(served) == 2:  # between the second and third page, every item changes
                config_store.store.put("default", [("prompt", f"p{n:02d}", "new") for n in range(30)])
        return outcome

    config_store.operations.execute = execute_then_write_once  # type: ignore[method-assign]
    config_client.page_limit = 10
    values = await config_client.getvalues("prompt")
    assert set(values.values()) == {"new"} and len(values) == 30  # never a mix of the two versions
    assert served == [1, 1, 2, 2, 2, 2]  # three pages at version 1 (the third seen moved), then all three again


async def test_a_toolset_reads_only_its_two_types_and_is_not_disturbed_by_10_mb_of_other_items(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    version = await put_tools(config_client, 3)
    version = await put_blobs(config_client, 3)
    with pytest.raises(ConfigError, match="answer-too-large|over the broker's message limit") as caught:
        await config_client.config(timeout=10)  # the whole workspace in one answer cannot be sent: said at once
    assert caught.value.code == "answer-too-large"
    async with ToolSet(connection=connection, settings=settings, poll_interval=60.0) as tools:
        assert (
            tools.names() == ["t-00000", "t-00001", "t-00002"] and tools.version == version and tools.source == "store"
        )
        await config_client.put([("blob", "b3", "d" * BLOB_BYTES), ("tool", "t-00003", tool(3))])
        await tools.wait_for(lambda t: "t-00003" in t.names(), timeout=10)


async def test_an_item_no_answer_could_carry_is_refused_at_put_in_one_line(
    connection: Transport, config_store: ConfigStoreService, config_client: ConfigClient
) -> None:
    with pytest.raises(ConfigRefused) as caught:
        await config_client.put([("blob", "big", "x" * 5_000_000)])
    assert "blob/big is 5000002 bytes" in str(caught.value) and "\n" not in str(caught.value)
    # Written by a client that checks nothing: the store refuses it, measured as it would answer (non-ASCII escaped).
    escaped = "é" * (MAX_ITEM_BYTES // 6 + 1)  # 2 bytes each in the request, 6 in an answer
    answer = await raw(connection, {"operation": "put", "values": [{"type": "blob", "key": "wide", "value": escaped}]})
    assert answer["error"]["type"] == "invalid" and f"up to {MAX_ITEM_BYTES} bytes" in answer["error"]["message"]
    with pytest.raises(ConfigRefused, match="smaller batches"):
        await config_client.put([("blob", f"b{n}", "y" * 1_500_000) for n in range(3)])
    assert config_store.store.version == 0
    biggest = "z" * (MAX_ITEM_BYTES - 2)  # the largest item taken comes back in one answer
    await config_client.put([("blob", "biggest", biggest)])
    assert (await config_client.getvalues("blob")) == {"biggest": biggest}


async def test_the_registry_lists_in_pages(
    connection: Transport, config_client: ConfigClient, registry_client: RegistryClient
) -> None:
    await config_client.put(
        [("tool-service", "bulk", json.dumps(SERVICE))] + [("tool", f"t-{n:05d}", tool(n)) for n in range(7)]
    )
    registry_client.page_limit = 3
    listing = await registry_client.list()
    assert [t.name for t in listing.tools] == [f"t-{n:05d}" for n in range(7)]
    assert all(t.source == "static" for t in listing.tools)


class Huge(DynamicToolService):
    descriptor: ClassVar[dict[str, Any]] = {"id": "huge"}
    tools: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "answer",
            "description": "Answers with `size` bytes",
            "arguments": [{"name": "size", "type": "integer", "description": "Bytes"}],
        }
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return "x" * int(arguments["size"])


async def test_an_answer_too_large_for_the_broker_is_an_error_at_once_not_a_timeout(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    async with Huge(settings=settings, announce=False) as huge:
        await config_client.put(static_items(huge))
        async with ToolSet(connection=connection, settings=settings, limits=30) as tools:
            started = time.monotonic()
            with pytest.raises(ToolError) as caught:
                await tools.invoke("answer", {"size": 10_000_000})
            took = time.monotonic() - started
            assert caught.value.type == "answer-too-large" and "stream it in parts" in caught.value.message
            assert "\n" not in str(caught.value)
            assert took < 5, f"the caller heard after {took:.1f}s"
            assert await tools.invoke("answer", {"size": 3}) == "xxx"  # the service goes on answering


def test_the_trustgraph_store_ignores_page_fields_as_trustgraph_does(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "config.sqlite")
    try:
        store.put("default", [("prompt", f"p{n}", "x") for n in range(3)])
        request = ConfigRequest(operation="getvalues", workspace="default", type="prompt", limit=1)
        answer = ConfigOperations(store, "trustgraph").execute(request)
        assert [v.key for v in answer.response.values] == ["p0", "p1", "p2"]
        assert set(answer.response.to_trustgraph()) == TRUSTGRAPH_FIELDS
    finally:
        store.close()

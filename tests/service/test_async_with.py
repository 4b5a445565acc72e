"""The start/stop classes of `toolservice_base` as `async with` blocks: started on entry, stopped on exit."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from support import eventually
from support.registry import descriptors

from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, RequestClient, Transport
from toolservice_base.announcer import Announcer
from toolservice_base.rpc import RequestServer
from toolservice_base.schemas import Announcement
from toolservice_base.transport import Envelope


async def echo(message: Envelope, reply: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    await reply({"echo": json.loads(message.data)["text"]})


async def test_a_request_server_and_client_serve_inside_async_with_and_let_go_after(connection: Transport) -> None:
    requests, responses = connection.topics.request_queue("with-echo"), connection.topics.response_queue("with-echo")
    async with RequestServer(connection, requests, responses, echo, subscription="with-echo") as server:
        assert server.connected
        async with RequestClient(connection, requests, responses) as client:
            assert (await client.request({"text": "hi"}, timeout=5))["echo"] == "hi"
        assert client._publisher is None and client._subscription is None and client._private is None
    assert not server.connected


async def test_a_config_client_answers_inside_async_with_and_is_closed_after(
    connection: Transport, config_store: ConfigStoreService
) -> None:
    async with ConfigClient(connection, timeout=5) as client:
        version = await client.put([("note", "with", json.dumps("hello"))])
        assert await client.version() == version
    assert client._rpc._publisher is None and client._rpc._subscription is None


async def test_an_announcer_announces_on_entry_and_withdraws_on_exit(connection: Transport) -> None:
    heard: list[Announcement] = []

    async def keep(message: Envelope) -> None:
        heard.append(Announcement.model_validate_json(message.data))

    await connection.subscribe(connection.topics.tool_descriptors, keep)
    service, tools = descriptors("with-svc")
    async with Announcer(connection, service, tools, ttl=30) as announcer:
        await eventually(lambda: [a.kind for a in heard] == ["announce"])
    await eventually(lambda: [a.kind for a in heard] == ["announce", "withdraw"])
    assert announcer.withdrawn and {a.instance for a in heard} == {announcer.instance}

"""Hostile schemas on `tool-descriptors`: a megabyte, 200 levels deep, a remote `$ref`, not a schema at all. Each is
refused in one line, at once, and the announcement carrying it is refused whole: none of its tools (not the good
one beside it) reaches the store, so nothing is half-announced."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest
from support import eventually
from support.registry import TOPICSPACE

from discovery.registry.client import RegistryClient
from discovery.registry.service import Registry
from discovery.registry.validation import AnnouncementValidator, Rejected
from toolservice_base import ConfigClient, Transport
from toolservice_base.schemas import canonical_json


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    "a megabyte": (
        {"type": "object", "properties": {f"p{i}": {"description": "x" * 1000} for i in range(1024)}},
        "bytes; the limit is 65536",
    ),
    "200 levels deep": (nested(200), "recursion limit"),
    "40 levels deep": (nested(40), "nested more than 32 levels deep"),
    "a remote $ref": ({"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/x.json"}}}, "outside itself"),
    "not a schema": ({"type": "object", "required": "everything"}, "is not a valid JSON Schema at required"),
}


def raw_announce(schema: dict[str, Any], instance: str = "hostile-1") -> bytes:
    """An announce of service `hostile` with a good tool and one carrying `schema`, digest and all, built by hand."""
    space = TOPICSPACE[0]
    service = {
        "id": "hostile",
        "request-queue": f"non-persistent://{space}/request/hostile",
        "response-queue": f"non-persistent://{space}/response/hostile",
    }
    tools = [
        {"type": "tool-service", "name": "good", "description": "fine", "service": "hostile", "arguments": []},
        {
            "type": "tool-service",
            "name": "bad",
            "description": "bad",
            "service": "hostile",
            "arguments": [],
            "input-schema": schema,
        },
    ]
    body = {"service": service, "tools": tools}
    digest = hashlib.sha256(canonical_json(body).encode()).hexdigest()
    message = {"kind": "announce", "instance": instance, "sequence": 1, "sent-at": time.time(), **body}
    return canonical_json({**message, "digest": digest}).encode()


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_schema_is_refused_in_one_line_at_once(case: str) -> None:
    schema, says = HOSTILE[case]
    started = time.perf_counter()
    with pytest.raises(Rejected) as refused:
        AnnouncementValidator().check(raw_announce(schema), time.time())
    assert time.perf_counter() - started < 1.0
    assert says in refused.value.reason and "\n" not in refused.value.reason, refused.value.reason


async def test_an_announcement_with_one_hostile_schema_is_refused_whole_and_listed_with_its_reason(
    connection: Transport, registry: Registry, config_client: ConfigClient
) -> None:
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    try:
        for number, case in enumerate(sorted(HOSTILE)):
            await publisher.send(raw_announce(HOSTILE[case][0], instance=f"hostile-{number}"))
        async with RegistryClient(connection, timeout=5) as client:
            rejected = await eventually(
                lambda: _rejected(client, len(HOSTILE)), timeout=10, explain=lambda: client.rejections()
            )
    finally:
        await connection.close_publisher(publisher)
    assert {r.instance for r in rejected} == {f"hostile-{n}" for n in range(len(HOSTILE))}
    assert await config_client.list("tool") == [] and await config_client.list("tool-service") == []


async def _rejected(client: RegistryClient, count: int) -> list[Any] | None:
    found = [r for r in await client.rejections() if (r.instance or "").startswith("hostile-")]
    return found if len(found) >= count else None

"""Every consumer on a real broker, fed random bytes, random JSON and mutated valid messages.

One broker per test, hundreds of messages through it; the corpus comes from
hypothesis's engine (`garbage_support.corpus`). For each consumer: nothing
crashes (no handler raised: the `*.handler_failed` log events), every bad
message is answered or dropped with a logged reason, the store does not move,
and the consumer still does its job afterwards.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError
from support import eventually
from support.garbage import (
    batches,
    captured_logs,
    corpus,
    crashes,
    figures,
    mutated,
    only,
    random_bytes,
    random_json,
)
from support.registry import announcement

from agent_bridge import ToolSet
from discovery.registry.client import RegistryClient
from discovery.registry.protocol import RegistryRequest
from discovery.registry.service import Registry
from discovery.registry.validation import AnnouncementValidator, Rejected
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, RequestClient, RequestTimeout, Settings, Transport, topics
from toolservice_base.examples.echo import EchoService
from toolservice_base.schemas import (
    MAX_CONFIG_REQUEST_BYTES,
    MAX_PUSH_BYTES,
    MAX_QUERY_BYTES,
    MAX_REQUEST_BYTES,
    ConfigPush,
    ConfigRequest,
    validate_config_item,
)

pytestmark = pytest.mark.contract

RANDOM = 250
MUTATED = 400
BATCH = 100


async def send_all(publisher: Any, messages: list[bytes]) -> None:
    for batch in batches(messages, BATCH):
        await asyncio.gather(*(publisher.send(m) for m in batch))


async def ask_all(client: RequestClient, messages: list[bytes], timeout: float = 10.0) -> list[dict[str, Any]]:
    """Every message as a request; each must get an answer.

    The topics are non-persistent, and a broker under a burst may drop a
    message (Apache Pulsar's dispatcher does when a connection is briefly
    unwritable), which says nothing about the consumer. So a request left
    unanswered is asked once more, alone: a consumer that ignores or chokes
    on a message stays silent both times and fails the test, as does a
    loss rate above one in a hundred.
    """
    answers: list[dict[str, Any] | None] = []
    for batch in batches(messages, BATCH):
        answers += await asyncio.gather(*(_answer(client, m, timeout) for m in batch))
    unanswered = [n for n, answer in enumerate(answers) if answer is None]
    assert len(unanswered) <= max(1, len(messages) // 100), (
        f"{len(unanswered)} of {len(messages)} requests went unanswered"
    )
    for n in unanswered:
        answers[n] = await client.request(messages[n], timeout=timeout)
    return [answer for answer in answers if answer is not None]  # none is left None: each got its answer


async def _answer(client: RequestClient, message: bytes, timeout: float) -> dict[str, Any] | None:
    try:
        return await client.request(message, timeout=timeout)
    except RequestTimeout:
        return None


def garbage(valid: list[dict[str, Any]], refused: Any) -> list[bytes]:
    """Random bytes, random JSON and mutated `valid` documents, keeping those `refused` says are bad."""
    candidates = corpus(random_bytes, RANDOM) + corpus(random_json, RANDOM) + corpus(mutated(valid), MUTATED)
    return only(list(dict.fromkeys(candidates)), refused)


def refused_by_validator(namespaces: tuple[str, ...]) -> Callable[[bytes], bool]:
    """Refused by a fresh validator (the registry's namespaces) now and 10 s from now: so the registry refuses it
    whenever it arrives."""

    def refused(data: bytes) -> bool:
        now = time.time()
        for at in (now, now + 10):
            try:
                AnnouncementValidator(namespaces).check(data, at)
                return False
            except Rejected:
                pass
        return True

    return refused


def refused_by_model(model: Any) -> Any:
    def refused(data: bytes) -> bool:
        try:
            model.model_validate_json(data)
        except ValidationError:
            return True
        return False

    return refused


async def test_the_registry_drops_every_bad_announcement_with_a_reason_and_writes_nothing(
    settings: Settings,
    connection: Transport,
    config_client: ConfigClient,
    registry: Registry,
    registry_client: RegistryClient,
) -> None:
    valid = [
        announcement("svc", ("a", "b"), ttl=30).to_wire(),
        announcement("svc", kind="heartbeat", sequence=2, ttl=30).to_wire(),
        announcement("svc", kind="withdraw", sequence=3).to_wire(),
    ]
    bad = garbage(valid, refused_by_validator(connection.topics.queue_namespaces)) + [b"x" * 70_000, b"[" * 100_000]
    version = (await config_client.config())[0]
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    with captured_logs() as logs:
        await send_all(publisher, bad)
        await eventually(lambda: registry.rejection_log.total >= len(bad), timeout=20.0)
        await registry.settle()
        assert (await config_client.config())[0] == version and registry.store_writes == 0
        assert registry.rejection_log.total == len(bad)
        assert all(r.reason.strip() and "\n" not in r.reason for r in await registry_client.rejections())
        logged = [entry for entry in logs if entry["event"] == "announcement.rejected"]
        assert len(logged) == len(bad) and all(entry["reason"] for entry in logged)
        assert crashes(logs) == []
        await publisher.send(announcement("good", ("fine",), ttl=30).to_json())
        await eventually(lambda: config_client.list("tool"), timeout=2.0)
        assert await config_client.list("tool") == ["fine"]
    figures("registry-announcements", tried=len(bad), crashes=len(crashes(logs)), store_writes_from_bad=0)


async def test_the_registry_query_api_answers_every_bad_query_and_changes_nothing(
    connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    valid = [
        {"operation": "list"},
        {"operation": "get", "name": "x", "workspace": "default"},
        {"operation": "rejections"},
    ]
    bad = garbage(valid, refused_by_model(RegistryRequest)) + [b" " * (MAX_QUERY_BYTES + 1)]
    version = (await config_client.config())[0]
    client = RequestClient(connection, connection.topics.registry_request, connection.topics.registry_response)
    try:
        with captured_logs() as logs:
            answers = await ask_all(client, bad)
            assert all(answer["error"]["type"] == "bad-request" and answer["error"]["message"] for answer in answers)
            assert "the limit is" in answers[-1]["error"]["message"]
            assert len([e for e in logs if e["event"] == "registry.query_rejected"]) == len(bad)
            assert crashes(logs) == []
            assert "tools" in await client.request({"operation": "list"}, timeout=5)
    finally:
        await client.close()
    assert (await config_client.config())[0] == version
    figures(
        "registry-queries", tried=len(bad), answered=len(answers), crashes=len(crashes(logs)), store_writes_from_bad=0
    )


async def test_the_config_store_answers_every_bad_request_and_its_version_never_moves(
    connection: Transport, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    tool = {
        "type": "tool-service",
        "name": "forecast",
        "description": "d",
        "service": "weather",
        "arguments": [{"name": "city", "type": "string", "description": "c"}],
    }
    valid = [
        {"operation": "put", "workspace": "default", "values": [{"type": "note", "key": "k", "value": "v"}]},
        {"operation": "get", "keys": [{"type": "tool", "key": "forecast"}]},
        {
            "operation": "delete",
            "keys": [{"type": "tool", "key": "forecast"}],
            "expect": [{"type": "tool", "key": "forecast", "value": None}],
        },
        {"operation": "getvalues", "type": "tool"},
    ]
    unparsable = garbage(valid, refused_by_model(ConfigRequest))

    def bad_tool(data: bytes) -> bool:
        try:
            validate_config_item("tool", "forecast", data.decode())
        except (ValueError, UnicodeDecodeError):
            return True
        return False

    # Well-formed puts whose `tool` item is not a valid tool: the store must refuse each.
    bad_items = [
        json.dumps(
            {"operation": "put", "values": [{"type": "tool", "key": "forecast", "value": value.decode()}]}
        ).encode()
        for value in only(corpus(mutated([tool]), MUTATED), bad_tool)
        if _utf8(value)
    ]
    oversized = b'{"operation": "get", "keys": [], "pad": "' + b"x" * MAX_CONFIG_REQUEST_BYTES + b'"}'
    version = (await config_client.config())[0]
    client = RequestClient(connection, connection.topics.config_request, connection.topics.config_response)
    try:
        with captured_logs() as logs:
            answers = await ask_all(client, [*unparsable, oversized])
            assert all(answer["error"]["type"] == "bad-request" and answer["error"]["message"] for answer in answers)
            assert "the limit is" in answers[-1]["error"]["message"]
            assert len([e for e in logs if e["event"] == "config.request_rejected"]) == len(unparsable) + 1
            refused = await ask_all(client, bad_items)
            assert all(
                answer["error"]["type"] == "invalid" and "tool/forecast" in answer["error"]["message"]
                for answer in refused
            )
            assert crashes(logs) == []
    finally:
        await client.close()
    assert (await config_client.config())[0] == version == config_store.store.version
    assert await config_client.list("tool") == []
    tried = len(unparsable) + 1 + len(bad_items)
    figures(
        "config-store",
        tried=tried,
        answered=len(answers) + len(refused),
        crashes=len(crashes(logs)),
        store_writes_from_bad=0,
    )


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


async def test_a_tool_service_answers_every_bad_request_and_keeps_serving(
    settings: Settings, connection: Transport
) -> None:
    valid = [{"user": "u", "config": "{}", "arguments": json.dumps({"text": "hi"})}]
    messages = list(
        dict.fromkeys(corpus(random_bytes, RANDOM) + corpus(random_json, RANDOM) + corpus(mutated(valid), MUTATED))
    )
    deep = json.dumps({"arguments": "[" * 50_000 + "]" * 50_000}).encode()
    messages += [b" " * (MAX_REQUEST_BYTES + 1), deep]
    async with EchoService(settings=settings, announce=False) as echo:
        queues = echo.service_descriptor
        client = RequestClient(connection, queues.request_queue, queues.response_queue)
        try:
            with captured_logs() as logs:
                answers = await ask_all(client, messages)
                assert all(answer.get("end_of_stream") is True for answer in answers)
                errors = [a for a in answers if a.get("error")]
                assert all(a["error"]["type"] == "bad-request" and a["error"]["message"] for a in errors)
                assert (
                    "the limit is" in answers[-2]["error"]["message"]
                    and "nested too deeply" in answers[-1]["error"]["message"]
                )
                assert len([e for e in logs if e["event"] == "request.rejected"]) == len(errors)
                assert crashes(logs) == []
                good = await client.request(
                    {"user": "", "config": "{}", "arguments": json.dumps({"text": "still here"})}, timeout=5
                )
                assert good["response"] == "still here"
        finally:
            await client.close()
    figures(
        "tool-service", tried=len(messages), answered=len(answers), bad_request=len(errors), crashes=len(crashes(logs))
    )


async def test_the_toolset_drops_every_bad_push_and_still_follows_real_changes(
    settings: Settings, connection: Transport, config_client: ConfigClient
) -> None:
    async with EchoService(settings=settings, announce=False) as echo:
        await config_client.put(
            [
                ("tool-service", "echo", echo.service_descriptor.to_json()),
                ("tool", "echo", echo.tool_descriptors[0].to_json()),
            ]
        )
        valid = [
            {"version": 5, "changes": {"tool": ["default"], "tool-service": ["default"]}},
            {"version": 1, "changes": {}},
        ]
        bad = garbage(valid, refused_by_model(ConfigPush)) + [
            b'{"version": 1, "changes": {"x": ["' + b"y" * MAX_PUSH_BYTES + b'"]}}'
        ]
        async with ToolSet(connection=connection, settings=settings, poll_interval=60.0) as tools:
            before = (tools.version, tools.names())
            publisher = await connection.publisher(connection.topics.config_notify)
            with captured_logs() as logs:
                await send_all(publisher, bad)
                await eventually(
                    lambda: len([e for e in logs if e["event"] == "config.push_rejected"]) >= len(bad), timeout=10.0
                )
                assert len([e for e in logs if e["event"] == "config.push_rejected"]) == len(bad)
                assert all(e["reason"] for e in logs if e["event"] == "config.push_rejected")
                assert "the limit is" in [e for e in logs if e["event"] == "config.push_rejected"][-1]["reason"]
                assert (tools.version, tools.names()) == before and await tools.invoke("echo", {"text": "ok"}) == "ok"
                assert crashes(logs) == []
                second = echo.tool_descriptors[0].model_copy(update={"name": "echo2"})
                await config_client.put([("tool", "echo2", second.to_json())])
                await tools.wait_for(lambda t: "echo2" in t.names(), timeout=5.0)
    figures("toolset-push", tried=len(bad), crashes=len(crashes(logs)), store_writes_from_bad=0)


def test_the_corpus_holds_every_kind_of_bad_input() -> None:
    """A guard on the generator: the sets above are not accidentally empty or all alike."""
    bad = garbage([announcement("svc").to_wire()], refused_by_validator(topics.DEFAULT.queue_namespaces))
    assert len(bad) > 600
    kinds = {"not json": 0, "not an object": 0, "object": 0}
    for data in bad:
        try:
            value = json.loads(data)
        except ValueError:
            kinds["not json"] += 1
            continue
        kinds["object" if isinstance(value, dict) else "not an object"] += 1
    assert all(count > 50 for count in kinds.values()), kinds

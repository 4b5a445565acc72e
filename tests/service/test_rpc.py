"""Request/response on a real broker: each caller gets its answers on a queue of its own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support import eventually

from toolservice_base import ConfigClient, RequestClient, Transport, TransportError
from toolservice_base.rpc import REPLY_TO, CallLimits, RequestServer, reply_queue
from toolservice_base.rpc.wire import ID
from toolservice_base.transport import Envelope

pytestmark = pytest.mark.contract

REQUESTS = "non-persistent://tg/request/rpc-echo"
RESPONSES = "non-persistent://tg/response/rpc-echo"

Reply = Callable[[dict[str, Any]], Awaitable[None]]


async def echo(message: Envelope, reply: Reply) -> None:
    await reply({"echo": json.loads(message.data)["text"]})


async def listen(connection: Transport, topic: str) -> list[Envelope]:
    """Every message that arrives on `topic` from now on."""
    seen: list[Envelope] = []

    async def keep(message: Envelope) -> None:
        seen.append(message)

    await connection.subscribe(topic, keep)
    return seen


def test_only_a_private_queue_of_the_servers_own_response_queue_is_accepted() -> None:
    assert reply_queue(RESPONSES, RESPONSES + ".a1b2") == RESPONSES + ".a1b2"
    assert reply_queue(RESPONSES, None) is None
    assert reply_queue(RESPONSES, "non-persistent://tg/response/other.a1b2") is None
    assert reply_queue(RESPONSES, RESPONSES + ".a/b") is None
    assert reply_queue(RESPONSES, RESPONSES + "." + "x" * 41) is None


async def test_each_caller_gets_its_answers_on_its_own_queue_and_the_shared_queue_stays_quiet(
    connection: Transport,
) -> None:
    requests_queue, responses_queue = (
        connection.topics.request_queue("rpc-echo"),
        connection.topics.response_queue("rpc-echo"),
    )
    server = RequestServer(connection, requests_queue, responses_queue, echo, subscription="rpc-echo")
    await server.start()
    first = await RequestClient(connection, requests_queue, responses_queue).start()
    second = await RequestClient(connection, requests_queue, responses_queue).start()
    shared = await listen(connection, responses_queue)
    try:
        answers = await asyncio.gather(
            *(
                client.request({"text": f"{n}-{i}"}, timeout=5)
                for n, client in enumerate((first, second))
                for i in range(20)
            )
        )
        assert [a["echo"] for a in answers] == [f"{n}-{i}" for n in range(2) for i in range(20)]
        assert first.reply_queue != second.reply_queue
        await asyncio.sleep(0.2)
        assert shared == [], "answers were broadcast on the shared response queue"
    finally:
        await first.close()
        await second.close()
        await server.stop()


async def test_a_server_that_answers_on_the_shared_queue_is_still_heard(connection: Transport) -> None:
    requests_queue, responses_queue = (
        connection.topics.request_queue("rpc-echo"),
        connection.topics.response_queue("rpc-echo"),
    )
    """A server built without `reply-to` support (an older version, or another implementation)."""
    answers = await connection.publisher(responses_queue)

    async def old_server(message: Envelope) -> None:
        text = json.loads(message.data)["text"]
        await answers.send({"echo": text}, properties={"id": message.properties["id"]})

    await connection.subscribe(requests_queue, old_server)
    client = await RequestClient(connection, requests_queue, responses_queue).start()
    try:
        assert (await client.request({"text": "hi"}, timeout=5))["echo"] == "hi"
    finally:
        await client.close()


async def test_a_reply_to_elsewhere_is_answered_on_the_shared_queue(connection: Transport) -> None:
    requests_queue, responses_queue = (
        connection.topics.request_queue("rpc-echo"),
        connection.topics.response_queue("rpc-echo"),
    )
    server = RequestServer(connection, requests_queue, responses_queue, echo, subscription="rpc-echo")
    await server.start()
    elsewhere = connection.topics.response_queue("not-the-callers")
    shared, other = await listen(connection, responses_queue), await listen(connection, elsewhere)
    requests = await connection.publisher(requests_queue)
    try:
        await requests.send({"text": "x"}, properties={"id": "r-1", REPLY_TO: elsewhere})
        for _ in range(100):
            if shared:
                break
            await asyncio.sleep(0.05)
        assert [m.properties["id"] for m in shared] == ["r-1"]
        assert other == []
    finally:
        await server.stop()


class _NoPrivateTopics:
    """A connection whose broker refuses to create topics other than the shared response queue (no broker needed)."""

    def __init__(self) -> None:
        self.attempts = 0
        self.sent: list[tuple[str, dict[str, str]]] = []

    async def publisher(self, topic: str) -> Any:
        if topic != RESPONSES:
            self.attempts += 1
            raise TransportError(f"the broker refused to create {topic}")
        connection = self

        class Shared:
            topic = RESPONSES

            async def send(self, data: bytes, properties: dict[str, str], **how: Any) -> None:
                connection.sent.append((topic, properties))

        return Shared()


async def test_when_a_private_queue_cannot_be_opened_answers_go_to_the_shared_queue_without_retrying() -> None:
    fake = _NoPrivateTopics()
    server = RequestServer(fake, REQUESTS, RESPONSES, echo, subscription="rpc-echo")  # type: ignore[arg-type]
    server._publisher = await fake.publisher(RESPONSES)
    private = RESPONSES + ".c1"
    await server._send({"echo": "a"}, "r-1", private)
    await server._send({"echo": "b"}, "r-2", private)
    assert fake.sent == [(RESPONSES, {"id": "r-1"}), (RESPONSES, {"id": "r-2"})]
    assert fake.attempts == 1


class _RefusingProducers:
    """A real connection whose producers on one topic are refused (a missing grant, say); it notes what it opened and
    closed."""

    def __init__(self, connection: Transport, refused: str, slow: float = 0.0) -> None:
        self._connection = connection
        self._refused = refused
        self._slow = slow  # seconds every other producer takes to open
        self.opened: list[Any] = []
        self.closed: list[Any] = []
        self.producers: list[Any] = []
        self.closed_producers: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    async def publisher(self, topic: str) -> Any:
        if topic == self._refused:
            await asyncio.sleep(0.05)  # refused after the subscriptions were made
            raise TransportError(f"not allowed to produce on {topic}")
        await asyncio.sleep(self._slow)
        publisher = await self._connection.publisher(topic)
        self.producers.append(publisher)
        return publisher

    async def close_publisher(self, publisher: Any) -> None:
        self.closed_producers.append(publisher)
        await self._connection.close_publisher(publisher)

    async def subscribe(self, *args: Any, **kwargs: Any) -> Any:
        subscription = await self._connection.subscribe(*args, **kwargs)
        self.opened.append(subscription)
        return subscription

    async def unsubscribe(self, subscription: Any) -> None:
        self.closed.append(subscription)
        await self._connection.unsubscribe(subscription)


async def test_a_client_whose_start_fails_half_way_leaves_no_subscription_open_and_can_start_again(
    connection: Transport,
) -> None:
    requests_queue, responses_queue = (
        connection.topics.request_queue("rpc-echo"),
        connection.topics.response_queue("rpc-echo"),
    )
    server = RequestServer(connection, requests_queue, responses_queue, echo, subscription="rpc-echo")
    await server.start()
    refusing = _RefusingProducers(connection, requests_queue)
    client = RequestClient(refusing, requests_queue, responses_queue)  # type: ignore[arg-type]
    try:
        with pytest.raises(TransportError, match="not allowed"):
            await client.start()
        # Its queue and its private one, both closed (they open side by side, so in either order).
        assert len(refusing.opened) == 2 and sorted(map(id, refusing.closed)) == sorted(map(id, refusing.opened))
        # And so is every producer it opened beside them (those that ping its queues, where the broker needs it),
        # one still opening as soon as it opens.
        await eventually(lambda: sorted(map(id, refusing.closed_producers)) == sorted(map(id, refusing.producers)))
        refusing._refused = ""  # the grant arrives
        await client.start()
        assert (await client.request({"text": "again"}, timeout=5))["echo"] == "again"
    finally:
        await client.close()
        await server.stop()


async def test_producers_still_opening_when_a_start_fails_are_closed_once_they_open(connection: Transport) -> None:
    """The start gives up at once (it does not wait on a broker that may not answer), and leaves nothing open."""
    if not connection.capabilities.confirm_subscription_receives:
        pytest.skip("this broker needs no ping, so a start opens no producer beside its request producer")
    requests_queue, responses_queue = (
        connection.topics.request_queue("rpc-echo"),
        connection.topics.response_queue("rpc-echo"),
    )
    refusing = _RefusingProducers(connection, requests_queue, slow=3.0)
    client = RequestClient(refusing, requests_queue, responses_queue)  # type: ignore[arg-type]
    started = asyncio.get_running_loop().time()
    with pytest.raises(TransportError, match="not allowed"):
        await client.start()
    assert asyncio.get_running_loop().time() - started < 2.5 and refusing.producers == []
    await eventually(lambda: len(refusing.producers) == 2 and len(refusing.closed_producers) == 2, timeout=10)
    assert sorted(map(id, refusing.closed_producers)) == sorted(map(id, refusing.producers))
    assert sorted(map(id, refusing.closed)) == sorted(map(id, refusing.opened))


async def test_a_started_client_keeps_only_its_request_producer_and_closing_it_closes_everything(
    connection: Transport,
) -> None:
    """Where the broker needs its queues pinged before the first request (`confirm_subscription_receives`), the
    producers that ping are opened beside the subscriptions and closed once the pings came back, off the caller's
    path; `close` still leaves nothing open."""
    requests_queue, responses_queue = (
        connection.topics.request_queue("rpc-echo"),
        connection.topics.response_queue("rpc-echo"),
    )
    server = RequestServer(connection, requests_queue, responses_queue, echo, subscription="rpc-echo")
    await server.start()
    watched = _RefusingProducers(connection, refused="")
    client = RequestClient(watched, requests_queue, responses_queue)  # type: ignore[arg-type]
    try:
        await client.start()
        pings = 2 if connection.capabilities.confirm_subscription_receives else 0
        assert len(watched.producers) == 1 + pings
        assert (await client.request({"text": "first"}, timeout=5))["echo"] == "first"
        await eventually(lambda: len(watched.closed_producers) >= pings, timeout=5)
        still_open = [p for p in watched.producers if p not in watched.closed_producers]
        assert [p.topic for p in still_open] == [requests_queue]
    finally:
        await client.close()
        await server.stop()
    assert sorted(map(id, watched.closed_producers)) == sorted(map(id, watched.producers))
    assert sorted(map(id, watched.closed)) == sorted(map(id, watched.opened))


async def test_a_handler_that_raises_has_its_caller_answered_with_an_error_and_the_server_goes_on(
    connection: Transport,
) -> None:
    requests_queue, responses_queue = (
        connection.topics.request_queue("rpc-faulty"),
        connection.topics.response_queue("rpc-faulty"),
    )

    async def faulty(message: Envelope, reply: Reply) -> None:
        text = json.loads(message.data)["text"]
        if text == "stream then fail":
            await reply({"chunk": "first", "end_of_stream": False})
        if text != "fine":
            raise RuntimeError("a bug in the handler")
        await reply({"echo": text})

    server = RequestServer(connection, requests_queue, responses_queue, faulty, subscription="rpc-faulty")
    await server.start()
    client = await RequestClient(connection, requests_queue, responses_queue).start()
    try:
        failed = await client.request({"text": "fail"}, timeout=5)
        assert failed["error"]["type"] == "internal-error" and failed["end_of_stream"] is True
        assert "RuntimeError" in failed["error"]["message"] and requests_queue in failed["error"]["message"]
        streamed = [
            body
            async for body in client.stream(
                {"text": "stream then fail"}, is_last=lambda body: body.get("end_of_stream", True), limits=CallLimits(5)
            )
        ]
        assert [body.get("chunk") for body in streamed] == ["first", None]
        assert streamed[-1]["error"]["type"] == "internal-error"
        assert await client.request({"text": "fine"}, timeout=5) == {"echo": "fine"}
    finally:
        await client.close()
        await server.stop()


async def test_a_config_request_resent_on_silence_keeps_its_id_so_a_store_can_tell_it_made_it(
    connection: Transport,
) -> None:
    """A store that made a write and could not answer (cut off, replaced) may meet its resend: one id for every
    attempt lets it answer as made instead of making it twice (`Journal.made`)."""
    if not connection.capabilities.resend_on_silence:
        pytest.skip("this broker loses no request, so a config client sends each once")
    topics = connection.topics
    ids: list[str] = []

    async def silent_once(message: Envelope, reply: Reply) -> None:
        ids.append(message.properties[ID])
        if len(ids) > 1:
            await reply({"version": 7})

    server = RequestServer(connection, topics.config_request, topics.config_response, silent_once, subscription="s")
    await server.start()
    client = await ConfigClient(connection, timeout=10).start()
    try:
        assert await client.put([("note", "k", "v")]) == 7
        assert len(ids) == 2 and ids[0] == ids[1], ids
    finally:
        await client.close()
        await server.stop()

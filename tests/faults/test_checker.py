"""The checker and the proxy themselves: a checker that passes all, or a proxy that faults nothing, proves nothing.

Hand-made histories with a known answer go through `lincheck` (porcupine)
and the property checks; the proxy is put between a plain TCP echo server and
a client, and each fault is seen doing what it says.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults import check
from faults.build import Binaries, build
from faults.history import History, Op
from faults.toxiproxy import Toxiproxy


@pytest.fixture(scope="session")
def binaries() -> Binaries:
    return build()


def write(history: History, client: int, puts: list[tuple[str, str]], version: int, **fields: object) -> Op:
    op = history.invoke(client, "write", puts=puts, **fields)
    history.complete(op, "ok", version=version)
    return op


def read(history: History, client: int, version: int, values: dict[str, str | None]) -> Op:
    op = history.invoke(client, "read", keys=list(values))
    history.complete(op, "ok", version=version, values=values)
    return op


def test_a_history_that_is_linearizable_passes(tmp_path: Path, binaries: Binaries) -> None:
    history = History(tmp_path / "h.jsonl")
    write(history, 0, [("k0", "a"), ("w0", "a")], 5)
    read(history, 1, 7, {"k0": "a"})  # another writer (the registry) moved the version: allowed
    conflict = history.invoke(1, "write", puts=[("k0", "x")], expect=[{"key": "k0", "value": "zzz"}])
    history.complete(conflict, "conflict")
    write(history, 0, [("k0", "b"), ("w0", "b")], 8, expect=[{"key": "k0", "value": "a"}])
    read(history, 1, 8, {"k0": "b"})
    history.close()
    assert check.linearizable(binaries.lincheck, history.path)["verdict"] == "ok"


def test_a_stale_read_fails_porcupine_and_is_named_with_the_write_it_missed(tmp_path: Path, binaries: Binaries) -> None:
    history = History(tmp_path / "h.jsonl")
    write(history, 0, [("k0", "a"), ("w0", "a")], 5)
    newer = write(history, 0, [("k0", "b"), ("w0", "b")], 6)
    stale = read(history, 1, 5, {"k0": "a"})
    history.close()
    result = check.linearizable(binaries.lincheck, history.path)
    assert result["verdict"] == "illegal"
    found = check.stale_reads(history.ops, history.ops[0].call)
    assert len(found) == 1 and f"#{stale.id}" in found[0] and f"#{newer.id}" in found[0]


def test_a_conditional_write_that_succeeded_against_a_failed_precondition_is_illegal(
    tmp_path: Path, binaries: Binaries
) -> None:
    history = History(tmp_path / "h.jsonl")
    write(history, 0, [("k0", "a"), ("w0", "a")], 5)
    write(history, 1, [("k0", "b"), ("w1", "b")], 6, expect=[{"key": "k0", "value": None}])  # k0 is not absent
    history.close()
    assert check.linearizable(binaries.lincheck, history.path)["verdict"] == "illegal"


def test_a_write_that_timed_out_is_settled_by_the_log(tmp_path: Path, binaries: Binaries) -> None:
    history = History(tmp_path / "h.jsonl")
    made = history.invoke(0, "write", puts=[("k0", "a"), ("w0", "a")])
    history.unanswered(made, "RequestTimeout")
    never = history.invoke(1, "write", puts=[("k0", "z"), ("w1", "z")])
    history.unanswered(never, "RequestTimeout")
    read(history, 2, 9, {"k0": "a"})
    history.close()
    log = [{"version": 9, "payload": {"puts": [["fault-note", "k0", "a"], ["fault-note", "w0", "a"]]}}]
    resolved = check.resolve(history.ops, check.applied(log))
    assert [(op.id, op.status, op.version) for op in resolved] == [(made.id, "persisted", 9), (3, "ok", 9)]
    settled = tmp_path / "settled.jsonl"
    settled.write_text("".join(op.to_json() + "\n" for op in resolved))
    assert check.linearizable(binaries.lincheck, settled)["verdict"] == "ok"
    # Had the log not held it, a read of its value could not be explained.
    assert check.linearizable(binaries.lincheck, tmp_path / "h.jsonl")["verdict"] == "ok"  # unknown: either way


def test_an_acknowledged_write_missing_from_the_log_is_lost(tmp_path: Path) -> None:
    history = History(tmp_path / "h.jsonl")
    kept = write(history, 0, [("k0", "a"), ("w0", "a")], 5)
    lost = write(history, 0, [("k0", "b"), ("w0", "b")], 6)
    history.close()
    log = [{"version": 5, "payload": {"puts": [["t", "k0", "a"], ["t", "w0", "a"]]}}]
    found = check.lost_writes(history.ops, log, None, kept.call)
    assert len(found) == 1 and f"#{lost.id}" in found[0]


def test_a_torn_batch_and_a_version_going_back_are_found(tmp_path: Path) -> None:
    history = History(tmp_path / "h.jsonl")
    write(history, 0, [("k0", "old"), ("w0", "old")], 5)
    write(history, 0, [("k0", "b"), ("k1", "b"), ("w0", "b")], 6)
    read(history, 1, 6, {"k0": "old", "k1": "b"})
    read(history, 1, 5, {"k0": "old", "k1": None})
    history.close()
    origin = history.ops[0].call
    assert len(check.torn_batches(history.ops, origin)) == 1
    assert len(check.versions_back(history.ops, origin)) == 1


def test_two_replicas_in_one_term_or_an_entry_after_a_newer_term_are_two_writers() -> None:
    markers = [{"term": 1, "replica": "a"}, {"term": 1, "replica": "a", "held": True}, {"term": 2, "replica": "b"}]
    assert check.two_writers(markers, [{"version": 1, "term": 1}, {"version": 2, "term": 2}]) == []
    assert check.two_writers([*markers, {"term": 2, "replica": "c"}], [])
    assert check.two_writers([*markers, {"term": 2, "replica": "b"}], []), "a second promotion to one term"
    assert check.two_writers([*markers, {"term": 1, "replica": "a", "held": True}], []), "a deposed holder's marker"
    late = check.two_writers(markers, [{"version": 1, "term": 1}, {"version": 2, "term": 2}, {"version": 2, "term": 1}])
    assert any("second writer" in line for line in late)


def test_an_expiry_a_ttl_after_the_last_heartbeat_is_fair_and_sooner_is_false() -> None:
    heard = {"i1": [100.0, 102.0]}
    assert check.false_expiries([{"at": 108.5, "ttl": 6, "instances": ["i1"]}], heard) == []
    assert check.false_expiries([{"at": 104.0, "ttl": 6, "instances": ["i1"]}], heard)


class Echo:
    """A TCP echo server on loopback, counting what it received."""

    def __init__(self) -> None:
        self.received = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            self.received += len(data)
            writer.write(data)
            await writer.drain()
        writer.close()


@pytest.fixture
def toxiproxy(binaries: Binaries, tmp_path: Path) -> Iterator[Toxiproxy]:
    with Toxiproxy(binaries.toxiproxy, tmp_path / "toxiproxy.log") as proxy:
        yield proxy


async def test_the_proxy_drops_stalls_delays_and_heals(toxiproxy: Toxiproxy) -> None:
    echo = Echo()
    server = await asyncio.start_server(echo.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    link = toxiproxy.link("p", f"127.0.0.1:{port}")
    host, proxied = link.listen.rsplit(":", 1)
    async with server:
        reader, writer = await asyncio.open_connection(host, int(proxied))
        writer.write(b"x")
        assert await asyncio.wait_for(reader.readexactly(1), 5) == b"x"

        link.stall()  # held, not lost: delivered once healed
        writer.write(b"held")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(4), 0.5)
        link.heal()
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"held"

        link.delay(200)
        started = time.monotonic()
        writer.write(b"d")
        await asyncio.wait_for(reader.readexactly(1), 5)
        assert time.monotonic() - started >= 0.35  # 200 ms each way
        link.heal()

        received = echo.received
        link.drop()  # a black hole: the server never sees it, the connection stays open
        writer.write(b"lost")
        await asyncio.sleep(0.5)
        assert echo.received == received and not reader.at_eof()
        link.heal()  # a stream that lost bytes cannot go on: healing closes it
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    assert [f.kind for f in toxiproxy.faults] == ["stall", "heal", "delay", "heal", "drop", "heal"]

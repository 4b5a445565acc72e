"""The config store replicated on Apache Pulsar (`toolreg up --store pulsar`): write latency, failover, standby
start-up.

    .venv/bin/python -m bench.b_replicated            # 1,000 writes per way, 20 kills, 1,000 and 100,000 items
    .venv/bin/python -m bench.b_replicated --quick    # 200 writes per way, 5 kills, 1,000 and 10,000 items

One Apache Pulsar 4.0 standalone (scripts/apache_pulsar.py, token
authentication on), a fresh tenant with the product's namespaces per part,
each figure beside its reference in the same run:

1. **Write latency**: a `ConfigClient.put` of one item (~200 bytes) against an
   active `ReplicatedStore` in this process, beside the same client against
   the SQLite store (`ConfigStoreService` over a file) and beside a bare
   persistent send of the same bytes a log entry has: pulsar.asyncio,
   unbatched (the target's reference), and the transport's
   `exclusive_publisher(topic, "fence")`, which is what the log writes
   through. The store's own append (the service's `journal.append`, i.e.
   `ReplicatedLog.append`: encode, persisted send, apply) is timed
   separately. The ways take turns in rounds (latency drifts on a shared machine).
2. **Failover**: two `toolreg up --store pulsar` processes; kill -9 of the
   active one, then a client retrying a put every 10 ms with a short timeout
   until one is acknowledged. The reference is the broker's own hand-over of
   the lock (its log's "Created new producer" on the lock topic after the
   kill); the survivor's log says when it was promoted and when it served.
   The killed one is restarted each round, so there are always two.
3. **Standby start-up**: items written in batches of 500 per put (a log of
   few entries), then a `ReplicatedStore` standby entered until its role is
   standby and its version the active's: first with no snapshot on the topic
   (a full replay of the log, which is what `use_snapshots=False` would do;
   `ReplicatedStore` does not expose that option), then once the active has
   written a snapshot (its `snapshot_every` is set to the number of batches,
   so the next put after them makes it write one). Beside it, what opening a
   reader at the log's last message costs against its first (a standby's
   start reads two topics' last message: the lock's marker, the last snapshot
   manifest).

Writes bench/results-replicated.json (or `--out`) and prints the table. Not
part of `python -m bench`: it starts its own Apache Pulsar.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import Any, Protocol

import pulsar
import pulsar.asyncio as pulsar_asyncio

from discovery.replicas import FORMAT
from discovery.store.journal import Journal
from discovery.store.log_state import entry_payload
from discovery.store.replicated import ReplicatedStore
from discovery.store.service import ConfigStoreService
from discovery.store.sqlite import Write
from toolservice_base import ConfigClient, Settings, configure_logging, open_transport
from toolservice_base.errors import ConfigError, RequestTimeout
from toolservice_base.topics import Topics
from toolservice_base.transport import ReaderStart, Transport

from . import raw, report
from .common import ROOT, Progress, Workdirs, product_env, spawn, stop_process, summary_ms, until

NAME = "replicated"
TARGET_RATIO = 1.5
"""A replicated write against a bare persistent send of the same bytes (p50)."""
TARGET_FAILOVER_S = 2.0
"""kill -9 of the active to the first acknowledged write (p99)."""
ROUNDS = 5
WARMUP = 50
CLIENT_TIMEOUT = 0.1
"""The failover client's timeout per attempt (several times a put's p99): a request sent while nobody serves is
dropped (the config queues are non-persistent), so the first acknowledged write comes up to this much after serving."""
RETRY_EVERY = 0.01
BATCH = 500
READS = 10
"""Readers opened at the first and at the last message of the log, each."""
ITEM_TYPE = "bench"
PAD = "x" * 165
DEFAULT_OUT = Path(__file__).resolve().parent / "results-replicated.json"


def item(number: int) -> tuple[str, str, str]:
    """One config item of about 200 bytes (type, key and value)."""
    return ITEM_TYPE, f"item-{number:07d}", json.dumps({"n": number, "pad": PAD})


def entry_bytes(version: int, one: tuple[str, str, str]) -> bytes:
    """The log entry a put of `one` becomes (what the bare sends carry, so both ways send the same bytes)."""
    payload = entry_payload(Write(version, "default", [one], []))
    return json.dumps(
        {"format": FORMAT, "version": version, "term": 1, "payload": payload}, separators=(",", ":")
    ).encode()


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- the broker ----------------------------------------------------------------------------------


@dataclass
class Broker:
    """The run's Apache Pulsar (scripts/apache_pulsar.py), and a fresh tenant per part."""

    apache: Any
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    @classmethod
    def start(cls) -> "Broker":
        sys.path.insert(0, str(ROOT / "scripts"))
        from apache_pulsar import ApachePulsar

        return cls(ApachePulsar(auth=True).start())

    def stop(self) -> None:
        self.apache.stop()

    @property
    def url(self) -> str:
        return str(self.apache.url)

    @property
    def token(self) -> str:
        return str(self.apache.token or "")

    def tenant(self, what: str) -> str:
        """A fresh tenant with the product's namespaces (`state` among them, unlimited retention)."""
        name = f"bench-{self.run_id}-{what}"
        self.apache.create_tenant(name)
        return name

    async def producer_created(self, topic: str, since: float, timeout: float = 2.0) -> float | None:
        """When (seconds since the epoch) the broker's log says it next created a producer on `topic` after `since`."""
        try:
            await until(
                lambda: self._producer_created(topic, since) is not None,
                f"a producer on {topic}",
                timeout,
                interval=0.05,
            )
        except TimeoutError:
            return None
        return self._producer_created(topic, since)

    def _producer_created(self, topic: str, since: float) -> float | None:
        marker = f"Created new producer: Producer{{topic=PersistentTopic{{topic={topic}}}"
        for line in Path(self.apache.log_file).read_text(errors="replace").splitlines():
            if marker in line:
                at = datetime.strptime(line.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%S,%f%z").timestamp()
                if at >= since - 0.002:  # the broker logs milliseconds
                    return at
        return None

    def settings(self, tenant: str, data_dir: Path) -> Settings:
        data_dir.mkdir(parents=True, exist_ok=True)
        return Settings(
            data_dir=data_dir, pulsar_url=self.url, broker="apache-pulsar", topicspace=tenant, auth_token=self.token
        )


async def connect(stack: AsyncExitStack, settings: Settings) -> Transport:
    connection = await open_transport(settings)
    stack.push_async_callback(connection.close)
    return connection


async def config_client(stack: AsyncExitStack, settings: Settings, timeout: float) -> ConfigClient:
    """A client on a connection of its own, as another process would have."""
    client = ConfigClient(await connect(stack, settings), timeout=timeout)
    await client.start()
    stack.push_async_callback(client.close)
    return client


class EventTap(logging.Handler):
    """The structured events some library loggers emit at info, kept here (with when) instead of printed."""

    def __init__(self, *names: str) -> None:
        super().__init__(logging.INFO)
        self._loggers = [logging.getLogger(name) for name in names]
        self._saved: list[tuple[int, bool]] = []
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict):  # structlog hands the event dict over as the record's message
            self.events.append({**record.msg, "perf": time.perf_counter()})

    def __enter__(self) -> "EventTap":
        for logger in self._loggers:
            self._saved.append((logger.level, logger.propagate))
            logger.setLevel(logging.INFO)
            logger.propagate = False
            logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for logger, (level, propagate) in zip(self._loggers, self._saved):
            logger.removeHandler(self)
            logger.setLevel(level)
            logger.propagate = propagate

    def find(self, event: str, since: float = 0.0, **fields: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e.get("event") == event and e["perf"] >= since and all(e.get(k) == v for k, v in fields.items())
        ]


# --- 1. write latency ----------------------------------------------------------------------------


class TimedJournal:
    """The replicated store's journal, timed: how long `ReplicatedLog.append` takes inside a write."""

    def __init__(self, inner: Journal) -> None:
        self.inner = inner
        self.samples: list[float] = []

    async def append(self, write: Write, request: str | None = None) -> None:
        started = time.perf_counter()
        await self.inner.append(write, request)
        self.samples.append(time.perf_counter() - started)

    def made(self, request: str) -> int | None:
        return self.inner.made(request)

    def lost(self, reason: str) -> None:
        self.inner.lost(reason)

    async def confirm(self) -> str | None:
        return await self.inner.confirm()


class Sender(Protocol):
    async def send(self, data: bytes, properties: dict[str, str]) -> Any: ...


class BareProducer:
    """pulsar.asyncio alone, unbatched, on a persistent topic: no product code between a send and the broker."""

    def __init__(self, broker: Broker, topic: str) -> None:
        self._broker = broker
        self._topic = topic
        self._client: Any = None
        self._producer: Any = None

    async def __aenter__(self) -> "BareProducer":
        token = self._broker.token
        self._client = pulsar_asyncio.Client(
            self._broker.url, authentication=pulsar.AuthenticationToken(token) if token else None, logger=raw.QUIET
        )
        self._producer = await self._client.create_producer(self._topic, batching_enabled=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._producer.close()
        await self._client.close()

    async def send(self, data: bytes, properties: dict[str, str]) -> None:
        await self._producer.send(data, properties=properties)


async def _write_latency(
    broker: Broker, work: Path, quick: bool, progress: Progress
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    total = 200 if quick else 1000
    per_round = total // ROUNDS
    numbers = count()
    async with AsyncExitStack() as stack:
        progress.update(
            "write latency: starting the replicated store, the SQLite store and the bare producers", force=True
        )
        replicated_settings = broker.settings(broker.tenant("write-replicated"), work / "replicated")
        replica = await stack.enter_async_context(
            ReplicatedStore(await connect(stack, replicated_settings), replica_id="bench-writer")
        )
        await until(
            lambda: replica.service is not None, "the replica to be active and serving", timeout=60, interval=0.01
        )
        assert replica.service is not None and replica.service.journal is not None
        journal = TimedJournal(replica.service.journal)
        replica.service.journal = journal
        replicated = await config_client(stack, replicated_settings, timeout=10)

        sqlite_tenant = broker.tenant("write-sqlite")
        sqlite_settings = broker.settings(sqlite_tenant, work / "sqlite")
        service = ConfigStoreService.in_data_dir(await connect(stack, sqlite_settings), sqlite_settings.data_dir)
        await service.start()
        stack.push_async_callback(service.stop)
        sqlite = await config_client(stack, sqlite_settings, timeout=10)

        bare = await stack.enter_async_context(BareProducer(broker, f"persistent://{sqlite_tenant}/state/bench-bare"))
        transport = await connect(stack, sqlite_settings)
        fence = await transport.exclusive_publisher(f"persistent://{sqlite_tenant}/state/bench-fence", "fence")
        stack.push_async_callback(transport.close_publisher, fence)

        async def put(client: ConfigClient, n: int) -> list[float]:
            samples = []
            for _ in range(n):
                one = item(next(numbers))
                started = time.perf_counter()
                await client.put([one])
                samples.append(time.perf_counter() - started)
            return samples

        async def send(publisher: Sender, n: int) -> list[float]:
            samples = []
            for _ in range(n):
                number = next(numbers)
                data, properties = entry_bytes(number, item(number)), {"version": str(number)}
                started = time.perf_counter()
                await publisher.send(data, properties)
                samples.append(time.perf_counter() - started)
            return samples

        ways: dict[str, Callable[[int], Any]] = {
            "replicated": lambda n: put(replicated, n),
            "sqlite": lambda n: put(sqlite, n),
            "bare": lambda n: send(bare, n),
            "fence": lambda n: send(fence, n),
        }
        for run in ways.values():  # warm-up: the first calls pay for lazy set-up on both sides
            await run(WARMUP)
        journal.samples.clear()
        samples: dict[str, list[float]] = {way: [] for way in ways}
        for number in range(1, ROUNDS + 1):
            progress.update(
                f"write latency, round {number}/{ROUNDS}: {per_round} each of {', '.join(ways)}", force=True
            )
            for way, run in ways.items():
                samples[way] += await run(per_round)
        entry_size = len(entry_bytes(1, item(1)))
    stats = {way: summary_ms(values) for way, values in samples.items()}
    stats["append"] = summary_ms(journal.samples)
    repl, sqlite_ms, bare_ms, fence_ms, append = (stats[k] for k in ("replicated", "sqlite", "bare", "fence", "append"))
    ratio_p50, ratio_p99 = repl["p50_ms"] / bare_ms["p50_ms"], repl["p99_ms"] / bare_ms["p99_ms"]
    append_ratio = append["p50_ms"] / bare_ms["p50_ms"]
    progress.done(
        f"write p50 {repl['p50_ms']:.2f} ms (SQLite {sqlite_ms['p50_ms']:.2f} ms, bare send {bare_ms['p50_ms']:.2f} ms)"
    )
    rows: list[dict[str, Any]] = [
        {
            "figure": f"put of 1 item, p50: replicated vs SQLite store ({total} each)",
            "ours": repl["p50_ms"],
            "reference": sqlite_ms["p50_ms"],
            "unit": "ms",
        },
        {
            "figure": "put of 1 item, p99: replicated vs SQLite store",
            "ours": repl["p99_ms"],
            "reference": sqlite_ms["p99_ms"],
            "unit": "ms",
        },
        {
            "figure": "put, p50: replicated vs bare send (pulsar.asyncio)",
            "ours": repl["p50_ms"],
            "reference": bare_ms["p50_ms"],
            "unit": "ms",
        },
        {
            "figure": "put, p99: replicated vs bare send (pulsar.asyncio)",
            "ours": repl["p99_ms"],
            "reference": bare_ms["p99_ms"],
            "unit": "ms",
        },
        {
            "figure": "put p50 / bare send p50",
            "ours": round(ratio_p50, 2),
            "reference": 1.0,
            "unit": "x",
            "target": f"<= {TARGET_RATIO:g}x",
            "met": ratio_p50 <= TARGET_RATIO,
        },
        {"figure": "put p99 / bare send p99", "ours": round(ratio_p99, 2), "reference": 1.0, "unit": "x"},
        {
            "figure": "store's own append (ReplicatedLog.append), p50",
            "ours": append["p50_ms"],
            "reference": bare_ms["p50_ms"],
            "unit": "ms",
        },
        {"figure": "store's own append, p99", "ours": append["p99_ms"], "reference": bare_ms["p99_ms"], "unit": "ms"},
        {
            "figure": "append p50 / bare send p50",
            "ours": round(append_ratio, 2),
            "reference": 1.0,
            "unit": "x",
            "target": f"<= {TARGET_RATIO:g}x",
            "met": append_ratio <= TARGET_RATIO,
        },
        {
            "figure": "transport fence-mode send (what the log writes through), p50",
            "ours": fence_ms["p50_ms"],
            "reference": bare_ms["p50_ms"],
            "unit": "ms",
        },
    ]
    data = {
        "summaries_ms": stats,
        "ratio_p50": round(ratio_p50, 3),
        "ratio_p99": round(ratio_p99, 3),
        "append_ratio_p50": round(append_ratio, 3),
        "entry_bytes": entry_size,
        "writes_per_way": total,
    }
    return rows, data


# --- 2. failover ---------------------------------------------------------------------------------


@dataclass
class UpProcess:
    """One `toolreg up --store pulsar` process, its own data directory and log (JSON events, plus its printed lines)."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def events(self, since: float = 0.0) -> list[dict[str, Any]]:
        """Its JSON log events from `since` (seconds since the epoch), each with `at` (the same)."""
        found = []
        for line in self.text().splitlines():
            if not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
                at = datetime.fromisoformat(entry["timestamp"]).timestamp()
            except (ValueError, KeyError, TypeError):
                continue
            if at >= since:
                found.append({**entry, "at": at})
        return found

    async def wait_for(self, check: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"bench: {self.name} exited ({self.process.returncode}) before {what}:\n{self.text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"bench: {self.name}: no {what} after {timeout:g}s:\n{self.text()[-3000:]}")
            await asyncio.sleep(0.02)

    def has_event(self, event: str, since: float = 0.0) -> bool:
        return any(e.get("event") == event for e in self.events(since))


class UpGroup:
    """`toolreg up --store pulsar` processes on one tenant, started as an operator starts them."""

    def __init__(self, broker: Broker, tenant: str, root: Path) -> None:
        self.broker = broker
        self.tenant = tenant
        self.root = root
        self.started = 0
        self.processes: list[UpProcess] = []

    async def start(self) -> UpProcess:
        self.started += 1
        name = f"up-{self.started}"
        data_dir = self.root / name
        data_dir.mkdir(parents=True, exist_ok=True)
        env = product_env(
            self.broker.url,
            data_dir,
            "apache-pulsar",
            PULSAR_AUTH_TOKEN=self.broker.token,
            TOOLREG_TOPICSPACE=self.tenant,
            TOOLREG_STORE="pulsar",
            TOOLREG_LOG_LEVEL="info",
        )
        log = self.root / f"{name}.log"
        up = UpProcess(name, spawn(["-m", "discovery.cli", "up"], env, log), log)
        self.processes.append(up)
        await up.wait_for(lambda: "ready in" in up.text(), "'ready in'")
        return up

    def stop(self) -> None:
        for up in self.processes:
            stop_process(up.process)


async def _confirm(client: ConfigClient, key: str, timeout: float = 60.0) -> None:
    """One put acknowledged (retried on a timeout), so the active one serves before it is killed."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                await client.put([(ITEM_TYPE, key, "ok")])
                return
            except (RequestTimeout, ConfigError):
                await asyncio.sleep(RETRY_EVERY)


async def _failover(
    broker: Broker, work: Path, quick: bool, progress: Progress
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    kills = 5 if quick else 20
    tenant = broker.tenant("failover")
    group = UpGroup(broker, tenant, work / "failover")
    rounds: list[dict[str, Any]] = []
    try:
        progress.update("failover: starting two `toolreg up --store pulsar` processes", force=True)
        active = await group.start()
        await active.wait_for(lambda: active.has_event("config.replica_active"), "config.replica_active")
        standby = await group.start()
        async with AsyncExitStack() as stack:
            client = await config_client(
                stack, broker.settings(tenant, work / "failover" / "client"), timeout=CLIENT_TIMEOUT
            )
            for number in range(1, kills + 1):
                progress.update(
                    f"failover, kill {number}/{kills}: {active.name} (active) -9, {standby.name} takes over", force=True
                )
                await asyncio.sleep(1.0)  # the standby is queued for the lock and heard by the group
                await _confirm(client, f"before-{number}")
                rounds.append(await _one_kill(client, active, standby, number))
                handover = await broker.producer_created(Topics(topicspace=tenant).state_lock, rounds[-1]["killed_at"])
                rounds[-1]["broker_handover_s"] = _rounded(
                    handover - rounds[-1]["killed_at"] if handover is not None else None
                )
                await asyncio.to_thread(active.process.wait)
                active, standby = standby, await group.start()  # the killed one, back: a standby
                if standby.has_event("config.replica_active"):
                    rounds[-1]["odd"] = f"the restarted {standby.name} became active"
    finally:
        group.stop()
    took_ms, handover_ms, promoted_ms, serving_ms = (
        _summary(rounds, key) for key in ("ack_s", "broker_handover_s", "promoted_s", "serving_s")
    )
    p99_s = took_ms["p99_ms"] / 1000
    progress.done(f"failover p50 {took_ms['p50_ms']:.0f} ms, p99 {took_ms['p99_ms']:.0f} ms over {kills} kills")
    rows: list[dict[str, Any]] = [
        {
            "figure": f"kill -9 of the active -> first acknowledged write, p50 ({kills} kills)",
            "ours": took_ms["p50_ms"] / 1000,
            "reference": handover_ms["p50_ms"] / 1000,
            "unit": "s",
        },
        {
            "figure": "kill -9 of the active -> first acknowledged write, p99",
            "ours": p99_s,
            "reference": handover_ms["p99_ms"] / 1000,
            "unit": "s",
            "target": f"<= {TARGET_FAILOVER_S:g} s",
            "met": p99_s <= TARGET_FAILOVER_S,
        },
        {
            "figure": "kill -9 -> survivor serving (config.replica_active), p50 / p99",
            "ours": serving_ms["p50_ms"] / 1000,
            "reference": serving_ms["p99_ms"] / 1000,
            "unit": "s",
        },
    ]
    data = {
        "kills": kills,
        "client_timeout_s": CLIENT_TIMEOUT,
        "retry_every_s": RETRY_EVERY,
        "ack_ms": took_ms,
        "broker_handover_ms": handover_ms,
        "promoted_ms": promoted_ms,
        "serving_ms": serving_ms,
        "rounds": rounds,
    }
    return rows, data


async def _one_kill(client: ConfigClient, active: UpProcess, survivor: UpProcess, number: int) -> dict[str, Any]:
    """kill -9 `active`; put every RETRY_EVERY until one is acknowledged; what the survivor's log says happened
    meanwhile."""
    errors: Counter[str] = Counter()
    killed_at = time.time()
    started = time.perf_counter()
    os.kill(active.process.pid, signal.SIGKILL)
    while True:
        try:
            await client.put([(ITEM_TYPE, f"after-{number}", "ok")])
            break
        except (RequestTimeout, ConfigError) as exc:
            errors[type(exc).__name__] += 1
            if time.perf_counter() - started > 120:
                raise RuntimeError(
                    f"bench: no write acknowledged 120 s after killing {active.name}:\n{survivor.text()[-3000:]}"
                ) from None
        await asyncio.sleep(RETRY_EVERY)
    took = time.perf_counter() - started
    await survivor.wait_for(
        lambda: survivor.has_event("config.replica_active", killed_at), "config.replica_active", timeout=10
    )
    events = survivor.events(killed_at)
    first = {
        e["event"]: e["at"] - killed_at for e in reversed(events)
    }  # the first time each event was logged after the kill
    timeline = [
        (e["event"], round((e["at"] - killed_at) * 1000, 1)) for e in events if e["at"] - killed_at <= took + 0.5
    ]
    return {
        "round": number,
        "killed_at": killed_at,
        "ack_s": round(took, 4),
        "attempts": sum(errors.values()) + 1,
        "errors": dict(errors),
        "promoted_s": _rounded(first.get("election.promoted")),
        "writable_s": _rounded(first.get("log.writable")),
        "serving_s": _rounded(first.get("config.replica_active")),
        "survivor_timeline_ms": timeline,
    }


def _summary(rounds: list[dict[str, Any]], key: str) -> dict[str, float]:
    return summary_ms([r[key] for r in rounds if r.get(key) is not None])


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


# --- 3. standby start-up -------------------------------------------------------------------------


async def _standby_start(settings: Settings, active: ReplicatedStore, tap: EventTap, name: str) -> dict[str, Any]:
    """Enter a standby until it says standby at the active's version: seconds, and how its log started."""
    async with AsyncExitStack() as stack:
        connection = await connect(stack, settings)  # not timed: a process has its connection before the store starts
        target = active.version
        started = time.perf_counter()
        standby = await stack.enter_async_context(ReplicatedStore(connection, replica_id=name))
        await until(
            lambda: standby.role == "standby" and standby.version == target, "the standby to catch up", timeout=600
        )
        took = time.perf_counter() - started
        found = [e for e in tap.find("log.started", since=started) if e.get("version") == target]
        log_started = found[-1] if found else {}
    return {
        "seconds": round(took, 4),
        "restore_s": log_started.get("restore_s"),
        "replay_s": log_started.get("replay_s"),
        "restored_items": log_started.get("restored_items"),
        "replayed_entries": log_started.get("replayed"),
    }


async def _startup(
    broker: Broker, work: Path, quick: bool, progress: Progress
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    sizes = (1_000, 10_000) if quick else (1_000, 100_000)
    repeats = 2 if quick else 3
    rows: list[dict[str, Any]] = []
    data: dict[str, Any] = {"batch": BATCH, "repeats": repeats, "item_bytes": sum(map(len, item(0))), "sizes": {}}
    with EventTap("discovery.replicas.log") as tap:
        for size in sizes:
            figures = data["sizes"][str(size)] = await _startup_of(broker, work, size, repeats, tap, progress)
            snapshot_s = statistics.median(r["seconds"] for r in figures["snapshot"])
            replay_s = statistics.median(r["seconds"] for r in figures["replay"])
            rows.append(
                {
                    "figure": (
                        f"standby start, {size:,} items: from a snapshot vs full log replay (median of {repeats})"
                    ),
                    "ours": round(snapshot_s, 3),
                    "reference": round(replay_s, 3),
                    "unit": "s",
                }
            )
        last, first = figures["read_last_message_ms"], figures["read_first_message_ms"]
        rows.append(
            {
                "figure": f"open a reader and read the last message vs the first, p50 ({READS} each)",
                "ours": last["p50_ms"],
                "reference": first["p50_ms"],
                "unit": "ms",
            }
        )
    progress.done(
        ", ".join(
            f"{size:,} items: {r['ours']:.2f} s from a snapshot, {r['reference']:.2f} s by replay"
            for size, r in zip(sizes, rows)
        )
    )
    return rows, data


async def _startup_of(
    broker: Broker, work: Path, size: int, repeats: int, tap: EventTap, progress: Progress
) -> dict[str, Any]:
    """`size` items in an active replica of a fresh tenant; standbys started by full replay, then from a snapshot."""
    settings = broker.settings(broker.tenant(f"startup-{size}"), work / f"startup-{size}")
    batches = -(-size // BATCH)
    async with AsyncExitStack() as stack:
        # No snapshot while the items go in; the put after them (the batches + 1st append) makes the active write one.
        active = await stack.enter_async_context(
            ReplicatedStore(await connect(stack, settings), replica_id="bench-active", snapshot_every=batches + 1)
        )
        await until(
            lambda: active.service is not None, "the replica to be active and serving", timeout=60, interval=0.01
        )
        client = await config_client(stack, settings, timeout=120)
        written = time.perf_counter()
        for batch in range(batches):
            progress.update(f"start-up, {size:,} items: writing batch {batch + 1}/{batches}")
            await client.put([item(n) for n in range(batch * BATCH, min(size, (batch + 1) * BATCH))])
        write_s = time.perf_counter() - written
        replay = []
        for repeat in range(repeats):
            progress.update(
                f"start-up, {size:,} items: standby by full log replay ({repeat + 1}/{repeats})", force=True
            )
            replay.append(await _standby_start(settings, active, tap, f"bench-replay-{repeat}"))
        asked = time.perf_counter()
        await client.put([(ITEM_TYPE, "snapshot-now", "1")])
        await until(
            lambda: tap.find("log.snapshot_written", since=asked, version=active.version), "the snapshot", timeout=300
        )
        written_snapshot = tap.find("log.snapshot_written", since=asked)[-1]
        snapshot = []
        for repeat in range(repeats):
            progress.update(f"start-up, {size:,} items: standby from the snapshot ({repeat + 1}/{repeats})", force=True)
            snapshot.append(await _standby_start(settings, active, tap, f"bench-snapshot-{repeat}"))
        reader = await connect(stack, settings)
        first_ms = summary_ms(await _read_one(reader, reader.topics.state_log, "earliest", READS))
        last_ms = summary_ms(await _read_one(reader, reader.topics.state_log, "latest", READS))
        return {
            "read_first_message_ms": first_ms,
            "read_last_message_ms": last_ms,
            "log_entries": active.version,
            "write_s": round(write_s, 2),
            "replay": replay,
            "snapshot": snapshot,
            "snapshot_written": {
                k: written_snapshot.get(k) for k in ("version", "items", "chunks", "bytes", "seconds")
            },
        }


async def _read_one(connection: Transport, topic: str, start: ReaderStart, repeats: int) -> list[float]:
    """Seconds to open a reader at `start`, inclusive, and read that one message (as the log and the election do)."""
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        reader = await connection.reader(topic, start, inclusive=True)
        try:
            if await reader.has_message_available():
                await reader.read_next(10.0)
            samples.append(time.perf_counter() - started)
        finally:
            await connection.close_reader(reader)
    return samples


# --- the run -------------------------------------------------------------------------------------


async def run(broker: Broker, work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    root = work.make(NAME)
    load: dict[str, list[float]] = {"start": load_average()}
    rows, data = [], {}
    for part, measure in (("write_latency", _write_latency), ("failover", _failover), ("standby_startup", _startup)):
        part_rows, data[part] = await measure(broker, root, quick, progress)
        rows += part_rows
        load[f"after_{part}"] = load_average()
    data["load_average"] = load
    return {
        "name": NAME,
        "title": "Config store replicated on Apache Pulsar",
        "rows": rows,
        "reference_is": (
            "writes: the same ConfigClient against the SQLite store, and a bare unbatched persistent send of a log "
            "entry's bytes on pulsar.asyncio (the target's reference); failover: when the broker's log says it handed "
            "the lock (its exclusive producer) to the survivor; start-up: the same standby by full log replay"
        ),
        "data": data,
    }


def _command(argv: list[str]) -> str:
    return report.command_line(argv).replace("python -m bench", "python -m bench.b_replicated", 1)


def _print_details(result: dict[str, Any]) -> None:
    data = result["data"]
    print(f"\nload average (1/5/15 min): {data['load_average']}")
    failover = data["failover"]
    print(
        "failover, p50 after the kill: "
        + ", ".join(
            f"{what} {failover[key]['p50_ms']:.0f} ms"
            for what, key in (
                ("broker hands the lock over", "broker_handover_ms"),
                ("election.promoted", "promoted_ms"),
                ("config.replica_active", "serving_ms"),
                ("first write acknowledged", "ack_ms"),
            )
        )
    )
    slow = max(failover["rounds"], key=lambda r: r["ack_s"])
    print(
        f"slowest failover (kill {slow['round']}): {slow['ack_s']:.3f} s after {slow['attempts']} attempt(s)"
        f" {slow['errors']}; broker handover {slow['broker_handover_s']} s; survivor's log, ms after the kill:"
        f" {slow['survivor_timeline_ms']}"
    )
    for r in data["failover"]["rounds"]:
        if r.get("odd"):
            print(f"odd: kill {r['round']}: {r['odd']}")
    for size, figures in data["standby_startup"]["sizes"].items():
        for way in ("replay", "snapshot"):
            print(
                f"start-up, {int(size):,} items, {way}: "
                + "; ".join(
                    f"{r['seconds']:.2f} s (restore {r['restore_s']} s, replay {r['replay_s']} s)" for r in figures[way]
                )
            )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.b_replicated", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 writes per way, 5 kills, 1,000 and 10,000 items")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"the results file (default: bench/{DEFAULT_OUT.name})"
    )
    args = parser.parse_args(argv)
    configure_logging("error")
    started = time.monotonic()
    broker = Broker.start()
    work = Workdirs()
    try:
        result = asyncio.run(run(broker, work, args.quick))
    finally:
        broker.stop()
        work.cleanup()
    wall = time.monotonic() - started
    result["seconds"] = round(wall, 1)
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": _command(argv),
        "wall_seconds": round(wall, 1),
        "broker": (
            f"Apache Pulsar {_pulsar_version()} standalone (scripts/apache_pulsar.py, token auth), one for the run"
        ),
        "machine": report.machine(),
        "versions": report.versions(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "benchmarks": [result]}, indent=2, default=str) + "\n")
    print(report.table([result]))
    _print_details(result)
    print(f"\nin {wall:.0f} s; wrote {args.out}")
    return 0


def _pulsar_version() -> str:
    from apache_pulsar import VERSION

    return str(VERSION)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

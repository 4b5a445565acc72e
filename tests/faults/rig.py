"""One run under faults: a replica group behind proxies, a recorded workload, a schedule, then the checker.

`run` starts a Toxiproxy with a link per process (each replica, the
clients, the agent, each tool service), the group (`toolreg up --store
pulsar` processes, each reaching the broker only through its link), two
echo service instances heartbeating, an agent (`ToolSet`) and the workload;
lets the schedule break things; heals everything and lets the group settle;
reads every key once more; and hands the history, the replicas' records
(the lock's term markers, the log's entries, their JSON logs) and what an
observer heard of the heartbeats to the checker. Everything lands under
`root`: `history.jsonl`, each process's log, `verdict.json`, and porcupine's
`history.html` when the history is not linearizable.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from apache_pulsar import ApachePulsar
from support.replicas import Cluster

from agent_bridge import ToolSet
from toolservice_base import ConfigClient, open_transport
from toolservice_base.examples.echo import EchoService
from toolservice_base.transport import Envelope, Transport, unique_name

from . import check
from .build import Binaries
from .history import History, Op
from .toxiproxy import Link, Toxiproxy, direct_connections
from .workload import KEYS, TIMEOUT, Workload

SERVICE_TTL = 6.0
WARMUP = 3.0
"""Seconds of workload before the schedule starts."""
SETTLE = 8.0
"""Seconds of workload after everything healed: the group must serve again, and whatever it says is checked."""
FINAL_CLIENT = 99
UNSAFE = Path(__file__).resolve().parent / "unsafe.py"
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEW = {"r0": "-2s", "r1": "+2s", "r2": "+1s"}
"""Wall-clock offsets (libfaketime) of the replicas of a run with `skew`: 4 s apart, each within every service's ttl
of the services' clocks (which the registry compares announcements with). Monotonic clocks are left alone: the
election's and the leases' timers read them, as does every process on a machine whose wall clock is stepped."""


@dataclass
class Rig:
    """What a schedule acts on."""

    apache: ApachePulsar
    proxy: Toxiproxy
    cluster: Cluster
    replicas: list[str]
    rng: random.Random
    frozen: set[str] = field(default_factory=set)
    killed: set[str] = field(default_factory=set)
    events: list[tuple[float, str]] = field(default_factory=list)
    """Process and broker faults, as (time.monotonic(), what): the links' faults are the proxy's."""

    def link(self, name: str) -> Link:
        return self.proxy.links[name]

    def roles(self) -> dict[str, tuple[str, int]]:
        """Each live replica's role and term, as its own log says last."""
        roles = {}
        for name in self.replicas:
            if name in self.killed:
                continue
            role, term = "standby", 0
            for line in self.cluster.output(name).splitlines():
                if '"election.' not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "election.promoted":
                    role, term = "active", int(event.get("term", 0))
                elif event.get("event") == "election.demoted":
                    role = "standby"
            roles[name] = (role, term)
        return roles

    def active(self) -> str:
        """The replica with the newest term among those that say they are active (a random one if none does)."""
        actives = [(term, name) for name, (role, term) in self.roles().items() if role == "active"]
        if actives:
            return max(actives)[1]
        return self.rng.choice([n for n in self.replicas if n not in self.killed])

    def standby(self) -> str:
        active = self.active()
        return self.rng.choice([n for n in self.replicas if n != active and n not in self.killed] or [active])

    def _event(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    def freeze(self, name: str) -> None:
        os.kill(self.cluster.processes[name].pid, signal.SIGSTOP)
        self.frozen.add(name)
        self._event(f"SIGSTOP {name}")

    def thaw(self, name: str) -> None:
        os.kill(self.cluster.processes[name].pid, signal.SIGCONT)
        self.frozen.discard(name)
        self._event(f"SIGCONT {name}")

    def kill(self, name: str) -> None:
        self.cluster.processes[name].kill()
        self.cluster.processes[name].wait()
        self.killed.add(name)
        self._event(f"kill -9 {name}")

    async def restart(self, name: str) -> None:
        await self.cluster.start(name)
        self.killed.discard(name)
        self._event(f"restarted {name}")

    async def restart_broker(self) -> float:
        self._event("broker stopping")
        away = await asyncio.to_thread(self.apache.restart)
        self._event(f"broker back after {away:.1f}s")
        return away

    async def heal(self) -> None:
        """Every link healed, every frozen replica resumed, every killed one started again."""
        self.proxy.heal_all()
        for name in list(self.frozen):
            self.thaw(name)
        for name in list(self.killed):
            await self.restart(name)


Schedule = Callable[[Rig], Awaitable[None]]


@dataclass
class Observed:
    """What an observer on a healthy connection heard: when each instance's announcements reached the broker."""

    heard: dict[str, list[float]] = field(default_factory=dict)

    async def on_message(self, message: Envelope) -> None:
        try:
            instance = str(json.loads(message.data)["instance"])
        except (ValueError, KeyError, TypeError):
            return
        self.heard.setdefault(instance, []).append(time.time())


async def read_topic(connection: Transport, topic: str) -> list[dict[str, Any]]:
    """Every JSON message of a persistent topic, from the start."""
    reader = await connection.reader(topic, "earliest")
    found = []
    try:
        while await reader.has_message_available():
            message = await reader.read_next(10.0)
            if message is None:
                continue
            try:
                found.append(json.loads(message.data))
            except ValueError:
                found.append({"unreadable": message.data[:100].decode(errors="replace")})
    finally:
        await connection.close_reader(reader)
    return found


def expiries(cluster: Cluster, names: list[str], skewed: bool = False) -> list[dict[str, Any]]:
    """The registry's lease expiries, from every replica's whole log, with their time on this process's wall clock
    (`skewed`: the replicas' clocks were set off by `SKEW`)."""
    found = []
    for name in names:
        for line in cluster.log(name).read_text(errors="replace").splitlines():
            if '"instance.expired"' not in line and '"service.expired"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            at = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
            at -= skew_of(name) if skewed and name in SKEW else 0.0
            found.append({"at": at, "instances": event.get("instances", []), "ttl": event.get("ttl", 0), "by": name})
    return found


@dataclass
class Run:
    """One run's set-up: where, which schedule, the seed."""

    apache: ApachePulsar
    tenant: str
    root: Path
    binaries: Binaries
    schedule: str
    seed: int
    replicas: int = 2
    unsafe: bool = False
    """Run the replicas as `unsafe.py` does: a deposed active goes on answering reads (the checker must fail it)."""
    skew: bool = False
    clients: int = 4


async def run(setup: Run, schedule: Schedule) -> check.Verdict:
    rng = random.Random(setup.seed)
    names = [f"r{i}" for i in range(setup.replicas)]
    async with AsyncExitStack() as stack:
        proxy = Toxiproxy(setup.binaries.toxiproxy, setup.root / "toxiproxy.log").start()
        stack.callback(proxy.stop)
        upstream = f"127.0.0.1:{setup.apache.broker_port}"
        links = {name: proxy.link(name, upstream) for name in [*names, "clients", "agent", "svc0", "svc1"]}
        cluster = Cluster(
            setup.apache,
            setup.tenant,
            setup.root,
            urls={name: links[name].url for name in names},
            extra_env=_skews(names) if setup.skew else {},
            program=(sys.executable, str(UNSAFE)) if setup.unsafe else Cluster.program,
        )
        stack.callback(cluster.stop_all)
        for name in names:
            await cluster.start(name)
        for name in names:
            direct = direct_connections(cluster.processes[name].pid, setup.apache.broker_port)
            assert direct == 0, f"{name} has {direct} connection(s) to the broker around its proxy"
        rig = Rig(setup.apache, proxy, cluster, names, rng)
        settings = cluster.settings()
        direct_connection = await open_transport(settings)
        stack.push_async_callback(direct_connection.close)
        observed = Observed()
        heard = await direct_connection.subscribe(
            settings.topics.tool_descriptors, observed.on_message, subscription=unique_name("fault-observer")
        )
        stack.push_async_callback(heard.close)
        for n in range(2):
            service = EchoService(settings=replace(settings, pulsar_url=links[f"svc{n}"].url), ttl=SERVICE_TTL)
            await service.start()
            stack.push_async_callback(service.stop)
        agent = ToolSet(settings=replace(settings, pulsar_url=links["agent"].url), store_timeout=5)
        await agent.start()
        stack.push_async_callback(agent.close)
        clients_connection = await open_transport(replace(settings, pulsar_url=links["clients"].url))
        stack.push_async_callback(clients_connection.close)
        client = await ConfigClient(clients_connection, timeout=TIMEOUT).start()
        stack.push_async_callback(client.close)
        history = History(setup.root / "history.jsonl")
        stack.callback(history.close)
        workload = Workload(history, setup.seed, clients=setup.clients)
        view = AgentView()
        started = time.monotonic_ns()
        load = asyncio.gather(workload.run(client), view.watch(agent, workload.stop))
        try:
            await asyncio.sleep(WARMUP)
            await schedule(rig)
            await rig.heal()
            await asyncio.sleep(SETTLE)
        finally:
            workload.stop.set()
            await load
        ended = time.monotonic_ns()
        final = await _final_read(workload, client)
        log = await read_topic(direct_connection, settings.topics.state_log)
        markers = await read_topic(direct_connection, settings.topics.state_lock)
        for name, records in (("log", log), ("markers", markers)):
            (setup.root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        verdict = judge(setup, history.ops, final, started, ended, log, markers, proxy, rig, view, observed, cluster)
        (setup.root / "verdict.json").write_text(json.dumps(verdict.to_json(), indent=2) + "\n")
        return verdict
    raise AssertionError("unreachable")  # for mypy: the stack does not swallow exceptions


def _skews(names: list[str]) -> dict[str, dict[str, str]]:
    """Each replica's environment for its skewed wall clock, checked to take effect (libfaketime is preloaded)."""
    if not FAKETIME.exists():
        raise RuntimeError(
            f"a run with skewed clocks needs libfaketime ({FAKETIME}; Debian: apt-get install libfaketime)"
        )
    envs = {
        name: {"LD_PRELOAD": str(FAKETIME), "FAKETIME": SKEW[name], "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        for name in names
        if name in SKEW
    }
    for name, env in envs.items():
        said = subprocess.run(
            [sys.executable, "-c", "import time; print(time.time())"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        offset = float(said.stdout) - time.time()
        assert abs(offset - skew_of(name)) < 0.5, f"{name}'s clock is {offset:+.1f}s off, not {SKEW[name]}"
    return envs


def skew_of(name: str) -> float:
    """The offset (seconds) of replica `name`'s wall clock in a run with `skew`."""
    return float(SKEW[name].removesuffix("s"))


@dataclass
class AgentView:
    """What the agent saw every 50 ms: its tool set's version, and when the echo tool was missing from it."""

    versions: list[int] = field(default_factory=list)
    missing: list[float] = field(default_factory=list)
    """time.monotonic() of each look that found no echo tool, after the first that found it."""

    async def watch(self, agent: ToolSet, stop: asyncio.Event) -> None:
        seen = False
        while not stop.is_set():
            if agent.version:
                self.versions.append(agent.version)
            if "echo" in agent.names():
                seen = True
            elif seen:
                self.missing.append(time.monotonic())
            await asyncio.sleep(0.05)

    def findings(self) -> list[str]:
        back = [
            f"the agent's tool set went from version {a} to {b}"
            for a, b in zip(self.versions, self.versions[1:])
            if b < a
        ]
        gone = []
        if self.missing:
            gone.append(
                f"the echo tool was missing from the agent's tool set for {len(self.missing) * 0.05:.1f}s in all"
                " while both its instances heartbeat through healthy links"
            )
        return back[:5] + gone


async def _final_read(workload: Workload, client: ConfigClient) -> Op:
    """Every key once more, after the run: tried until the group answers (a minute at most)."""
    deadline = time.monotonic() + 60
    while True:
        op = await workload.read(client, FINAL_CLIENT)
        if op.status == "ok" or time.monotonic() > deadline:
            return op
        await asyncio.sleep(1)


def judge(
    setup: Run,
    ops: list[Op],
    final: Op,
    started: int,
    ended: int,
    log: list[dict[str, Any]],
    markers: list[dict[str, Any]],
    proxy: Toxiproxy,
    rig: Rig,
    view: AgentView,
    observed: Observed,
    cluster: Cluster,
) -> check.Verdict:
    html = setup.root / "history.html"
    verdict = check.Verdict(setup.schedule, setup.seed)
    entries = check.applied(log)
    resolved = check.resolve(ops, entries)
    settled = setup.root / "history.resolved.jsonl"
    settled.write_text("".join(op.to_json() + "\n" for op in resolved))
    verdict.linearizable = check.linearizable(setup.binaries.lincheck, settled, html)
    if verdict.linearizable.get("verdict") == "ok":
        html.unlink(missing_ok=True)
    verdict.findings = {
        "stale_reads": check.stale_reads(ops, started),
        "lost_writes": check.lost_writes(ops, entries, final, started),
        "versions_back": check.versions_back([op for op in ops if op.client != FINAL_CLIENT], started),
        "torn_batches": check.torn_batches(ops, started),
        "two_writers": check.two_writers([m for m in markers if "term" in m], [e for e in log if "version" in e]),
        "false_expiries": check.false_expiries(expiries(cluster, rig.replicas, setup.skew), observed.heard),
        "agent": view.findings(),
    }
    if final.status != "ok":
        verdict.findings["lost_writes"].insert(
            0, f"the group did not answer a read within a minute after healing: {final.error}"
        )
    windows = check.unavailability(ops, started, ended)
    verdict.figures = check.figures(ops, len(proxy.faults) + len(rig.events), windows, (ended - started) / 1e9)
    verdict.figures["unavailable_s"] = windows
    unknown = [op for op in ops if op.op == "write" and op.status == "unknown"]
    verdict.figures["unknown_writes_made"] = sum(op.status == "persisted" for op in resolved)
    verdict.figures["unknown_writes_never_made"] = len(unknown) - verdict.figures["unknown_writes_made"]
    verdict.figures["keys"] = len(KEYS)
    verdict.figures["terms"] = len({m.get("term") for m in markers})
    verdict.figures["faults"] = [
        f"{f.at - started / 1e9:.1f}s {f.link} {f.kind} {f.detail or ''}".strip() for f in proxy.faults
    ] + [f"{at - started / 1e9:.1f}s {what}" for at, what in rig.events]
    return verdict

"""Measure the replicated state on Apache Pulsar: takeovers and start-up. Not part of `python -m bench`'s suite.

    python -m bench.replicas --url pulsar://127.0.0.1:6650 --topicspace T [--token TOKEN] [--runs 8] [--items 100000]

The topicspace needs the product's namespaces (`state` with unlimited
retention): deploy/pulsar-init.sh, or `ApachePulsar.create_tenant`.

- `kill9`: a holder process with an `exclusive` producer on a lock topic is
  killed (-9); a waiter here holds a `wait` attempt. Time from the kill to
  the waiter's producer (raw), and to an `Election`'s promotion (with its term
  marker), in ms.
- `fence`: the holder process is frozen (SIGSTOP); time for a `fence`
  producer to take the lock, in ms; and, with an `Election` and `Membership`
  in both processes (`takeover_after` 2 s), from the SIGSTOP to the standby's
  promotion.
- `startup`: `--items` entries of one ~200-byte item each in the log; time to
  start a replica by full replay, to write a snapshot, and to start from the
  snapshot (plus the entries after it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from contextlib import AsyncExitStack
from typing import Any

from discovery.replicas import Election, LogEntry, Membership, ReplicatedLog
from toolservice_base import Settings, open_transport
from toolservice_base.errors import ProducerBusy


class Items:
    """The state: a dict of items."""

    def __init__(self) -> None:
        self.items: dict[str, Any] = {}

    def apply(self, entry: LogEntry) -> None:
        self.items.update(entry.payload)

    def snapshot(self) -> Any:
        return ([key, value] for key, value in self.items.items())

    def restore(self, version: int, items: Any) -> None:
        self.items = {key: value for key, value in items}


def child(settings: Settings, lock: str, elected: bool) -> None:
    """The holder: take the lock (raw, or as an elected replica with heartbeats), say so, then wait to be killed or
    frozen."""

    async def hold() -> None:
        transport = await open_transport(settings)
        if not elected:
            await transport.exclusive_publisher(lock, "exclusive")
        else:
            members = await Membership(transport, "holder", lock).__aenter__()
            election = await Election(transport, lock, "holder", membership=members).__aenter__()
            await election.wait_active(30)
        print("holding", flush=True)
        await asyncio.Event().wait()

    asyncio.run(hold())


def start_holder(args: argparse.Namespace, lock: str, elected: bool = False) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "bench.replicas",
        "--url",
        args.url,
        "--topicspace",
        args.topicspace,
        "--child",
        lock,
    ]
    if args.token:
        command += ["--token", args.token]
    if elected:
        command += ["--elected"]
    holder = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    return holder


async def kill9(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    raw, elected = [], []
    async with await open_transport(settings) as transport:
        for run in range(args.runs):
            lock = f"persistent://{args.topicspace}/state/bench-lock-{uuid.uuid4().hex[:8]}"
            holder = start_holder(args, lock)
            waiting = asyncio.ensure_future(_wait_for(transport, lock))
            await asyncio.sleep(1.0)
            killed = time.perf_counter()
            os.kill(holder.pid, signal.SIGKILL)
            publisher = await waiting
            raw.append((time.perf_counter() - killed) * 1000)
            await transport.close_publisher(publisher)
            holder.wait()
            # The same through an Election (term read from the lock topic, marker written).
            holder = start_holder(args, lock)
            election = Election(transport, lock, f"bench-{run}")
            async with election:
                await asyncio.sleep(1.0)
                killed = time.perf_counter()
                os.kill(holder.pid, signal.SIGKILL)
                await election.wait_active(30)
                elected.append((time.perf_counter() - killed) * 1000)
            holder.wait()
    return {"raw_ms": _summary(raw), "election_ms": _summary(elected)}


async def _wait_for(transport: Any, lock: str) -> Any:
    while True:
        try:
            return await transport.exclusive_publisher(lock, "wait")
        except ProducerBusy:
            continue


async def fence(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    took, elected = [], []
    async with await open_transport(settings) as transport:
        for _ in range(args.runs):
            lock = f"persistent://{args.topicspace}/state/bench-lock-{uuid.uuid4().hex[:8]}"
            holder = start_holder(args, lock)
            os.kill(holder.pid, signal.SIGSTOP)
            started = time.perf_counter()
            publisher = await transport.exclusive_publisher(lock, "fence")
            took.append((time.perf_counter() - started) * 1000)
            await publisher.send(b"taken")
            await transport.close_publisher(publisher)
            os.kill(holder.pid, signal.SIGKILL)
            os.kill(holder.pid, signal.SIGCONT)
            holder.wait()
        for run in range(args.runs):
            lock = f"persistent://{args.topicspace}/state/bench-lock-{uuid.uuid4().hex[:8]}"
            holder = start_holder(args, lock, elected=True)
            async with AsyncExitStack() as stack:
                members = await stack.enter_async_context(Membership(transport, f"standby-{run}", lock))
                election = await stack.enter_async_context(
                    Election(transport, lock, f"standby-{run}", membership=members, takeover_after=2.0)
                )
                await asyncio.sleep(1.5)
                assert not election.is_active
                os.kill(holder.pid, signal.SIGSTOP)
                frozen = time.perf_counter()
                await election.wait_active(30)
                elected.append((time.perf_counter() - frozen) * 1000)
            os.kill(holder.pid, signal.SIGKILL)
            os.kill(holder.pid, signal.SIGCONT)
            holder.wait()
    return {"fence_ms": _summary(took), "election_after_sigstop_ms (takeover_after 2 s)": _summary(elected)}


async def startup(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:8]
    log_topic = f"persistent://{args.topicspace}/state/bench-log-{suffix}"
    snapshot_topic = f"persistent://{args.topicspace}/state/bench-snapshot-{suffix}"
    lock = f"persistent://{args.topicspace}/state/bench-lock-{suffix}"
    filler = "x" * 180
    result: dict[str, Any] = {"items": args.items}
    async with await open_transport(settings) as transport:
        writer = await transport.exclusive_publisher(log_topic, "fence")
        started = time.perf_counter()
        batch = 2000
        for first in range(1, args.items + 1, batch):
            await asyncio.gather(
                *(
                    writer.send({"format": 1, "version": n, "term": 1, "payload": {f"key-{n:08d}": filler}})
                    for n in range(first, min(first + batch, args.items + 1))
                )
            )
        result["write_log_s"] = round(time.perf_counter() - started, 2)
        await transport.close_publisher(writer)

    async def start(use_snapshots: bool) -> tuple[float, ReplicatedLog, Items, AsyncExitStack]:
        stack = AsyncExitStack()
        conn = await stack.enter_async_context(await open_transport(settings))
        state = Items()
        started = time.perf_counter()
        log = await stack.enter_async_context(
            ReplicatedLog(conn, state, log_topic=log_topic, snapshot_topic=snapshot_topic, use_snapshots=use_snapshots)
        )
        return time.perf_counter() - started, log, state, stack

    replay_s, replayed_log, replayed, stack = await start(False)
    assert replayed_log.version == args.items and len(replayed.items) == args.items
    await stack.aclose()
    result["full_replay_s"] = round(replay_s, 2)

    # An active replica writes a snapshot, then 1,000 more entries follow it.
    async with AsyncExitStack() as stack:
        conn = await stack.enter_async_context(await open_transport(settings))
        members = await stack.enter_async_context(Membership(conn, "bench", "bench"))
        election = Election(conn, lock, "bench", membership=members)
        state = Items()
        log = await stack.enter_async_context(
            ReplicatedLog(
                conn, state, election=election, log_topic=log_topic, snapshot_topic=snapshot_topic, snapshot_every=10**9
            )
        )
        await stack.enter_async_context(election)
        await log.wait_writable(60)
        started = time.perf_counter()
        manifest = await log.write_snapshot()
        result["write_snapshot_s"] = round(time.perf_counter() - started, 2)
        result["snapshot"] = {"chunks": manifest.chunks, "bytes": manifest.size}
        for n in range(1000):
            await log.append({f"after-{n}": filler})

    snap_s, snap_log, from_snapshot, stack = await start(True)
    result["snapshot_start_s"] = round(snap_s, 2)
    result["snapshot_start_replayed"] = snap_log.stats["applied"]
    assert len(from_snapshot.items) == args.items + 1000
    await stack.aclose()
    replay_s, replayed_log, replayed, stack = await start(False)
    result["full_replay_after_s"] = round(replay_s, 2)
    assert replayed.items == from_snapshot.items, "snapshot + tail must equal a full replay"
    await stack.aclose()
    return result


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "runs": [round(v, 1) for v in values],
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


async def main(args: argparse.Namespace, settings: Settings) -> None:
    results: dict[str, Any] = {}
    for name in args.only or ["kill9", "fence", "startup"]:
        results[name] = await {"kill9": kill9, "fence": fence, "startup": startup}[name](args, settings)
        print(json.dumps({name: results[name]}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--topicspace", required=True)
    parser.add_argument("--token")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--only", action="append", choices=["kill9", "fence", "startup"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--elected", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    chosen = Settings(
        pulsar_url=arguments.url, broker="apache-pulsar", topicspace=arguments.topicspace, auth_token=arguments.token
    )
    if arguments.child:
        child(chosen, arguments.child, arguments.elected)
    else:
        asyncio.run(main(arguments, chosen))

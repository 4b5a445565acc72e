"""What a schedule must never show, judged from the clients' history, the broker's topics and the replicas' records.

The history checks are the fault suite's own (`faults.check`: lost writes,
stale reads, versions that went back, two writers in a term), run on the
simulated history, plus what the group promises beyond them:

- a replica whose key is not the group's never becomes active, and stops;
- no replica of the group stops (a key rotation, a forgery or a replay stops
  nobody);
- a holder nobody could have found silent is never fenced;
- a forged status alone moves nobody;
- nothing read was never written (a forged entry applied would show);
- once every fault healed, the group serves writes again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from faults import check as history

from .replica import LOST_LOCK_GRACE, TAKEOVER_AFTER
from .world import World


def log_of(world: World) -> list[dict[str, Any]]:
    """The log as the fault suite's checker reads it: the replicas' own entries (a forger's are not the group's)."""
    names = {r.name for r in world.replicas}
    return [
        {
            "version": e.body["version"],
            "term": e.body.get("term", 0),
            "payload": {"puts": [["note", k, v] for k, v in e.body.get("puts", [])]},
        }
        for e in world.broker.topics["log"]
        if e.producer in names and isinstance(e.body.get("version"), int)
    ]


def markers_of(world: World) -> list[dict[str, Any]]:
    names = {r.name for r in world.replicas}
    return [m.body for m in world.broker.topics["markers"] if m.producer in names]


def findings(world: World) -> dict[str, list[str]]:
    ops = sorted(world.ops, key=lambda op: op.call)
    log = log_of(world)
    found = {
        "lost_writes": history.lost_writes(ops, log, None, 0),
        "stale_reads": history.stale_reads(ops, 0),
        "versions_back": history.versions_back(ops, 0),
        "two_writers": history.two_writers(markers_of(world), log),
        "stranger_active": [
            f"{r.name} (key {r.key.signing if r.key else 'none'}) became active at {at:.3f}s in term {term}"
            for r in world.replicas
            if not r.group
            for at, term in r.promotions
        ],
        "stranger_kept_running": [
            f"{r.name} never stopped" for r in world.replicas if not r.group and r.generation and r.stopped is None
        ],
        "group_stopped": [f"{r.name} stopped: {r.stopped}" for r in world.replicas if r.group and r.stopped],
        "needless_takeovers": needless_takeovers(world),
        "moved_by_a_status": moved_by_a_status(world),
        "never_written": never_written(world),
        "unavailable_after_healing": unavailable(world),
    }
    return {name: lines for name, lines in found.items() if lines}


def healthy(world: World, name: str, start: float, end: float) -> bool:
    return not any(a < end and b > start for a, b in world.unhealthy.get(name, []))


def needless_takeovers(world: World) -> list[str]:
    """A fence of a holder that had been active, alive, running and connected for the whole takeover wait before it
    (one granted the lock while frozen, say, is not: it never wrote its marker)."""
    return [
        f"{fencer} fenced {holder} at {at:.3f}s, active since {since:.3f}s and unhindered since"
        f" {at - TAKEOVER_AFTER:.3f}s at least"
        for at, fencer, holder, since in world.fences
        if holder is not None
        and since is not None
        and since <= at - TAKEOVER_AFTER
        and healthy(world, holder, at - TAKEOVER_AFTER, at)
    ]


def moved_by_a_status(world: World) -> list[str]:
    """A step-down of an active that still held the lock and the log's writer, hindered by nothing: nothing but a
    status (a hint) could have moved it."""
    found = []
    for at, name, held, why in world.stepdowns:
        hindered = any(start - 1.0 <= at <= end + 1.0 for start, end, kind in world.disturbed if kind == "receipts")
        if held and not hindered and healthy(world, name, at - LOST_LOCK_GRACE - 1.0, at):
            found.append(f"{at:.3f}s {name} stepped down holding the lock and the log, unhindered: {why}")
    return found


def never_written(world: World) -> list[str]:
    written = {value for op in world.ops if op.op == "write" for _, value in op.puts}
    return [
        f"client {op.client} read {key}={value}, which no client wrote"
        for op in world.ops
        if op.op == "read" and op.status == "ok"
        for key, value in op.values.items()
        if value is not None and value not in written
    ]


def unavailable(world: World) -> list[str]:
    start = world.seconds * 1e9
    late = [op for op in world.ops if op.op == "write" and op.call >= start]
    if not late or any(op.status == "ok" for op in late):
        return []
    return [f"no write acknowledged after {world.seconds:g}s, {world.seconds - world.healed_at:g}s after healing"]


def linearizable(world: World, lincheck: Path, where: Path) -> dict[str, Any]:
    """porcupine's verdict (the fault suite's `lincheck`) on the schedule's history, each write whose outcome its
    client could not know settled by the log (`faults.check.resolve`)."""
    ops = history.resolve(sorted(world.ops, key=lambda op: op.call), history.applied(log_of(world)))
    path = where / f"simulated-{world.seed}.jsonl"
    path.write_text("".join(op.to_json() + "\n" for op in ops))
    return history.linearizable(lincheck, path)

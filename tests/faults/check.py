"""The checker: a recorded history against a model of the store, and the properties the product promises.

- `linearizable`: porcupine (`lincheck`) over the whole history, the model a
  versioned key-value map with the store's conditional-write rules;
- `stale_reads`: a read answered with a version older than a write that was
  acknowledged before the read was sent: the smallest history that breaks
  linearizability, said as the two operations;
- `lost_writes`: every acknowledged write is in the replicated log at the
  version it was acknowledged with, with what it wrote; the last read sees
  no value older than the last acknowledged write of its key;
- `versions_back`: no client ever saw the version go back (its answers, in
  the order they came);
- `torn_batches`: no read saw part of a batch and, for another of its keys,
  a value older than the batch;
- `two_writers`: the replicas' own records, the lock topic's term markers
  and the log's entries: each term held by one replica, terms only growing
  (a `held` marker, the holder confirming its lock, repeats the newest term),
  the log's versions strictly increasing with terms that never go back (an
  entry from a deposed writer after a newer term would show);
- `false_expiries`: the registry expired no lease while its instance's
  heartbeats kept reaching the broker.
"""

from __future__ import annotations

import bisect
import json
import statistics
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .history import Op

LINCHECK_TIMEOUT = 120
UNAVAILABLE_AFTER = 1.0
"""Seconds without an acknowledged write that count as a window of unavailability."""


@dataclass
class Verdict:
    """What the checker found in one run."""

    schedule: str
    seed: int
    linearizable: dict[str, Any] = field(default_factory=dict)
    findings: dict[str, list[str]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.linearizable.get("verdict") == "ok" and not any(self.findings.values())

    def failed(self) -> list[str]:
        failed = [name for name, found in self.findings.items() if found]
        if self.linearizable.get("verdict") != "ok":
            failed.insert(0, f"linearizable ({self.linearizable.get('verdict')})")
        return failed

    def summary(self) -> str:
        """One paragraph: the verdict, then each finding's first lines."""
        head = f"{self.schedule} seed={self.seed}: {'PASS' if self.ok else 'FAIL ' + ', '.join(self.failed())}"
        lines = [head]
        for name, found in self.findings.items():
            lines += [f"  {name}: {line}" for line in found[:5]]
        if self.linearizable.get("longest_linearizable_prefix"):
            lines.append("  porcupine's longest linearizable prefix ends:")
            lines += [f"    {op}" for op in self.linearizable["longest_linearizable_prefix"][-6:]]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "seed": self.seed,
            "ok": self.ok,
            "linearizable": self.linearizable,
            "findings": self.findings,
            "figures": self.figures,
        }


def linearizable(lincheck: Path, history: Path, html: Path | None = None) -> dict[str, Any]:
    """porcupine's verdict on `history` (resolved, see `resolve`): {"verdict": "ok"|"illegal"|"unknown", ...}."""
    command = [str(lincheck), "-timeout", f"{LINCHECK_TIMEOUT}s", *(["-html", str(html)] if html else []), str(history)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=LINCHECK_TIMEOUT + 60)
    if done.returncode == 3 or not done.stdout.strip():
        raise RuntimeError(f"lincheck could not read {history}: {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def applied(log: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The log's entries that replicas apply: in the topic's order, each above every version before it."""
    kept: list[dict[str, Any]] = []
    for entry in log:
        if "version" in entry and (not kept or int(entry["version"]) > int(kept[-1]["version"])):
            kept.append(entry)
    return kept


def puts_of(entry: dict[str, Any]) -> set[tuple[str, str]]:
    """(key, value) of every item an entry puts."""
    payload = entry.get("payload", {})
    return {(str(k), str(v)) for _, k, v in payload.get("puts", [])} if isinstance(payload, dict) else set()


def resolve(ops: Sequence[Op], entries: Sequence[dict[str, Any]]) -> list[Op]:
    """The history porcupine checks: each write whose outcome its client could not know, settled by the log.

    Every write puts a unique value under its client's marker key, so the
    applied entry holding that value is the write, made at that entry's
    version (`persisted`: it may have taken effect at any moment after its
    invocation); a write no applied entry holds was never made and is left
    out, as a read without an answer is.
    """
    made = {value: int(entry["version"]) for entry in entries for key, value in puts_of(entry) if is_marker(key)}
    resolved = []
    for op in ops:
        if op.op == "write" and op.status == "unknown":
            version = made.get(next((v for k, v in op.puts if is_marker(k)), ""))
            if version is None:
                continue
            op = replace(op, status="persisted", version=version)
        resolved.append(op)
    return resolved


def is_marker(key: str) -> bool:
    return key.startswith("w")


def describe(op: Op, origin: int) -> str:
    invoked, completed = op.seconds(origin)
    span = f"[{invoked:.3f}s..{'?' if completed is None else f'{completed:.3f}s'}]"
    if op.op == "read":
        values = " ".join(f"{k}={v}" for k, v in op.values.items())
        return f"c{op.client} #{op.id} {span} read -> v{op.version} {values}"
    parts = [f"if {e['key']}={e['value']}" for e in op.expect]
    parts += [f"{k}:={v}" for k, v in op.puts] + [f"delete {k}" for k in op.deletes]
    result = f"v{op.version}" if op.status == "ok" else f"{op.status} {op.error}".strip()
    return f"c{op.client} #{op.id} {span} {', '.join(parts)} -> {result}"


def stale_reads(ops: Sequence[Op], origin: int) -> list[str]:
    """Reads older than a write acknowledged before they were sent, each with that write (the latest such)."""
    found = []
    acknowledged = sorted(
        (op for op in ops if op.acknowledged and op.return_ is not None), key=lambda op: op.return_ or 0
    )
    returned = [op.return_ or 0 for op in acknowledged]
    newest: list[Op] = []  # newest[i]: the acknowledged write of the highest version among the first i + 1 returned
    for write in acknowledged:
        newest.append(write if not newest or write.version > newest[-1].version else newest[-1])
    for read in ops:
        if read.op != "read" or read.status != "ok":
            continue
        count = bisect.bisect_left(returned, read.call)  # the writes acknowledged before the read was sent
        if count and read.version < newest[count - 1].version:
            found.append(f"{describe(read, origin)}  after  {describe(newest[count - 1], origin)}")
    return found


def versions_back(ops: Sequence[Op], origin: int) -> list[str]:
    found = []
    by_client: dict[int, list[Op]] = {client: [] for client in sorted({op.client for op in ops})}
    for op in ops:  # one pass, not one per client: a history is checked per schedule, thousands of them a minute
        if op.status == "ok" and op.return_ is not None:
            by_client[op.client].append(op)
    for client, answered in by_client.items():
        answered.sort(key=lambda op: op.return_ or 0)
        for earlier, later in zip(answered, answered[1:]):
            if later.version < earlier.version:
                found.append(f"client {client}: {describe(earlier, origin)}  then  {describe(later, origin)}")
    return found


def torn_batches(ops: Sequence[Op], origin: int) -> list[str]:
    """A read that shows a batch's value for one key and, for another of its keys, an acknowledged write older than
    the batch."""
    written = {v: op for op in ops if op.acknowledged for _, v in op.puts}
    found = []
    for read in ops:
        if read.op != "read" or read.status != "ok":
            continue
        for value in {v for v in read.values.values() if v is not None}:
            batch = written.get(value)
            keys = [k for k, _ in batch.puts if k in read.values] if batch is not None else []
            if batch is None or len(keys) < 2:
                continue
            for key in keys:
                other = written.get(read.values.get(key) or "")
                if read.values.get(key) != value and other is not None and other.version < batch.version:
                    found.append(f"{describe(read, origin)} shows part of {describe(batch, origin)}")
    return found


def lost_writes(ops: Sequence[Op], log: Sequence[dict[str, Any]], final: Op | None, origin: int) -> list[str]:
    """Acknowledged writes missing from the log (or different there), and keys whose last read went back."""
    entries = {int(e["version"]): e for e in applied(log)}
    found = []
    for op in ops:
        if not op.acknowledged:
            continue
        entry = entries.get(op.version)
        if entry is None or (op.puts and not set(op.puts) <= puts_of(entry)):
            found.append(f"not in the log at v{op.version}: {describe(op, origin)}")
    if final is not None and final.status == "ok":
        for key, value in final.values.items():
            last = max(
                (op for op in ops if op.acknowledged and (key in dict(op.puts) or key in op.deletes)),
                key=lambda op: op.version,
                default=None,
            )
            if last is None:
                continue
            newer = {v for op in ops if op.op == "write" and op.status != "conflict" for k, v in op.puts if k == key}
            if value is not None and value != dict(last.puts).get(key) and value not in newer:
                found.append(f"final read of {key} = {value}, older than {describe(last, origin)}")
    return found


def two_writers(markers: Sequence[dict[str, Any]], log: Sequence[dict[str, Any]]) -> list[str]:
    found = []
    holder: dict[int, str] = {}
    last_term = 0
    for marker in markers:
        term, replica = int(marker["term"]), str(marker["replica"])
        if holder.setdefault(term, replica) != replica:
            found.append(f"term {term} claimed by {holder[term]} and {replica}")
        if marker.get("held") and term != last_term:
            found.append(f"a held marker of term {term} after term {last_term}: a deposed holder wrote on the lock")
        elif not marker.get("held") and term <= last_term:
            found.append(f"marker term {term} after term {last_term}: terms went back on the lock")
        last_term = max(last_term, term)
    previous: dict[str, Any] | None = None
    for entry in log:
        if previous is not None:
            if int(entry["version"]) <= int(previous["version"]):
                found.append(
                    f"log entry v{entry['version']} (term {entry.get('term')}) after v{previous['version']} (term"
                    f" {previous.get('term')}): a second writer's entry"
                )
            if int(entry.get("term", 0)) < int(previous.get("term", 0)):
                found.append(f"log entry v{entry['version']} of term {entry.get('term')} after term {previous['term']}")
        if markers and int(entry.get("term", 0)) not in holder:
            found.append(f"log entry v{entry['version']} in term {entry.get('term')}, which no replica took")
        previous = entry
    return found


def false_expiries(expiries: Iterable[dict[str, Any]], heard: dict[str, list[float]], slack: float = 1.0) -> list[str]:
    """Expiries of instances whose heartbeat reached the broker less than a ttl (minus `slack`) before.

    `expiries`: the registry's `instance.expired`/`service.expired` events (wall clock `at`, `instances`, `ttl`);
    `heard`: when the broker delivered each instance's announcements to an observer (wall clock).
    """
    found = []
    for event in expiries:
        at, ttl = float(event["at"]), float(event["ttl"])
        for instance in event["instances"]:
            before = [t for t in heard.get(instance, []) if t <= at]
            if before and at - max(before) < ttl - slack:
                found.append(
                    f"{instance} expired at {at:.3f} though its heartbeat reached the broker {at - max(before):.1f}s"
                    f" before (ttl {ttl:g}s)"
                )
    return found


def unavailability(ops: Sequence[Op], start: int, end: int) -> list[float]:
    """Windows (seconds) longer than `UNAVAILABLE_AFTER` in which no write was acknowledged."""
    times = sorted([start, *(op.return_ for op in ops if op.acknowledged and op.return_ is not None), end])
    gaps = [(b - a) / 1e9 for a, b in zip(times, times[1:])]
    return [round(gap, 3) for gap in gaps if gap > UNAVAILABLE_AFTER]


def percentile(values: Sequence[float], share: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(share * 100) - 1], 3)


def figures(ops: Sequence[Op], faults: int, windows: Sequence[float], seconds: float) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for op in ops:
        statuses[f"{op.op}_{op.status}"] = statuses.get(f"{op.op}_{op.status}", 0) + 1
    return {
        "operations": len(ops),
        "by_outcome": dict(sorted(statuses.items())),
        "faults_injected": faults,
        "seconds": round(seconds, 1),
        "unavailable_windows": len(windows),
        "unavailable_p50_s": percentile(windows, 0.5),
        "unavailable_p99_s": percentile(windows, 0.99),
        "unavailable_max_s": max(windows, default=None),
    }

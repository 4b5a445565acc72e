"""The replicated store and registry under faults, checked: every schedule, seed after seed, for a set time.

    python -m bench --only faults                          # 30 minutes (BENCH_FAULTS_MINUTES), every schedule
    BENCH_FAULTS_MINUTES=12 python -m bench --only faults  # as many whole passes as start within 12 minutes
    python -m bench --only faults --quick                  # three schedules, once each (about two minutes)

Each run is one of the fault tests' runs (tests/faults/rig.py): two `toolreg
up --store pulsar` replicas, two echo services and an agent, each behind a
Toxiproxy link of its own to a real Apache Pulsar 4.0 standalone (the run's,
with `BENCH_BROKER=apache-pulsar`; else one this benchmark starts), four
clients writing, reading and batching through `ConfigClient` with every
operation recorded, a schedule of faults drawn from the seed, then the
checker: porcupine over the history and the promised properties (no
acknowledged write lost, versions never back, batches whole, one writer per
term, no lease expired while its instance heartbeat, the agent never losing
a live tool). A pass runs every schedule of `faults.schedules.SCHEDULES`
once, plus `combined` with the replicas' clocks skewed (libfaketime, +2 s
and -2 s); passes go on, with new seeds, until the time is spent.

A run that fails keeps its history, logs and verdict in a directory the
table's notes name (every other run's are removed); `seed` reproduces it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import common
from .common import ROOT, Progress, Workdirs

NAME = "faults"
MINUTES_ENV = "BENCH_FAULTS_MINUTES"
DEFAULT_MINUTES = 30.0
QUICK = ("partition-active", "partition-active-inbound", "freeze-active")
SKEWED = "combined (clocks skewed)"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _import_rig() -> Any:
    """The fault tests' rig, from tests/ (and the Apache Pulsar fixture from scripts/)."""
    for folder in ("scripts", "tests"):
        if str(ROOT / folder) not in sys.path:
            sys.path.insert(0, str(ROOT / folder))
    from faults import build, rig, schedules

    return build, rig, schedules


def _plan(schedules: Any, quick: bool) -> Iterator[tuple[str, int]]:
    """(schedule, seed) in the order they run: whole passes, each with seeds of its own."""
    names = list(QUICK) if quick else [*schedules.SCHEDULES, SKEWED]
    passes = 1 if quick else 1_000
    for number in range(passes):
        for index, name in enumerate(names):
            yield name, 1000 * (number + 1) + index


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    build, rig, schedules = _import_rig()
    binaries = await asyncio.to_thread(build.build)
    apache, own = common.APACHE_PULSAR, False
    if apache is None:
        from apache_pulsar import ApachePulsar

        apache, own = await asyncio.to_thread(ApachePulsar(auth=True).start), True
    minutes = float(os.environ.get(MINUTES_ENV, DEFAULT_MINUTES))
    kept = Path(tempfile.mkdtemp(prefix="toolreg-faults-"))
    progress = Progress(NAME)
    deadline = time.monotonic() + minutes * 60
    load = {"start": load_average()}
    verdicts: list[dict[str, Any]] = []
    try:
        for name, seed in _plan(schedules, quick):
            if not quick and time.monotonic() > deadline and len(verdicts) % _pass_length(schedules) == 0:
                break
            progress.update(f"{name} seed {seed} ({len(verdicts)} runs so far)", force=True)
            verdicts.append(await _one(apache, rig, schedules, binaries, work, kept, name, seed))
    finally:
        if own:
            await asyncio.to_thread(apache.stop)
    load["end"] = load_average()
    if not any(not v["ok"] for v in verdicts):
        shutil.rmtree(kept, ignore_errors=True)
    return _result(verdicts, minutes, load)


def _pass_length(schedules: Any) -> int:
    return len(schedules.SCHEDULES) + 1


async def _one(
    apache: Any, rig: Any, schedules: Any, binaries: Any, work: Workdirs, kept: Path, name: str, seed: int
) -> dict[str, Any]:
    tenant = f"f-{uuid.uuid4().hex[:10]}"
    root = work.make(f"{NAME}/{name.replace(' ', '-')}-{seed}")
    await asyncio.to_thread(apache.create_tenant, tenant)
    skew = name == SKEWED
    schedule = schedules.SCHEDULES["combined" if skew else name]
    started = time.monotonic()
    try:
        verdict = await rig.run(rig.Run(apache, tenant, root, binaries, name, seed, skew=skew), schedule)
    except Exception as exc:  # a run that could not finish is a failed run, with what stopped it
        verdict = None
        failure = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        await asyncio.to_thread(apache.delete_tenant, tenant)
    if verdict is None:
        outcome = {"schedule": name, "seed": seed, "ok": False, "failed": [failure], "figures": {}}
    else:
        first = [found[0] for found in verdict.findings.values() if found][:1]
        outcome = {"schedule": name, "seed": seed, "ok": verdict.ok, "failed": verdict.failed() + first}
        outcome["figures"] = verdict.figures
        outcome["windows"] = verdict.figures.get("unavailable_s", [])
    outcome["seconds"] = round(time.monotonic() - started, 1)
    if not outcome["ok"]:
        shutil.copytree(root, kept / root.name, dirs_exist_ok=True)
        outcome["kept"] = str(kept / root.name)
        print(f"\nfaults: {name} seed {seed} FAILED {outcome['failed']}; kept in {outcome['kept']}", file=sys.stderr)
    return outcome


def _result(verdicts: list[dict[str, Any]], minutes: float, load: dict[str, list[float]]) -> dict[str, Any]:
    from faults.check import percentile

    rows: list[dict[str, Any]] = []
    by_schedule: dict[str, list[dict[str, Any]]] = {}
    for verdict in verdicts:
        by_schedule.setdefault(verdict["schedule"], []).append(verdict)
    for name, runs in by_schedule.items():
        windows = [w for run in runs for w in run.get("windows", [])]
        operations = sum(run["figures"].get("operations", 0) for run in runs)
        passed = sum(run["ok"] for run in runs)
        rows.append(
            {
                "figure": f"{name}: runs passing the checker ({operations:,} operations; unavailable p50 / p99)",
                "ours": f"{passed} of {len(runs)} ({_seconds(percentile(windows, 0.5))} / "
                f"{_seconds(percentile(windows, 0.99))})",
                "target": "all",
                "met": passed == len(runs),
            }
        )
    windows = [w for run in verdicts for w in run.get("windows", [])]
    operations = sum(run["figures"].get("operations", 0) for run in verdicts)
    faults = sum(run["figures"].get("faults_injected", 0) for run in verdicts)
    passed = sum(run["ok"] for run in verdicts)
    rows += [
        {
            "figure": "runs passing the checker, every schedule",
            "ours": f"{passed} of {len(verdicts)}",
            "target": "all",
            "met": passed == len(verdicts),
        },
        {"figure": "operations recorded and checked", "ours": operations},
        {"figure": "faults injected (links, processes, the broker)", "ours": faults},
        {"figure": "unavailability windows (> 1 s with no write acknowledged)", "ours": len(windows)},
        {"figure": "unavailability window, p50", "ours": percentile(windows, 0.5), "unit": "s"},
        {"figure": "unavailability window, p99", "ours": percentile(windows, 0.99), "unit": "s"},
        {"figure": "unavailability window, max", "ours": max(windows, default=None), "unit": "s"},
    ]
    failed = [f"{v['schedule']} seed {v['seed']}: {', '.join(v['failed'])}" for v in verdicts if not v["ok"]]
    return {
        "name": NAME,
        "title": "Replicated store and registry under faults, checked (porcupine and the promised properties)",
        "rows": rows,
        "reference_is": (
            "none: the checker's verdict is the figure; an unavailability window is a stretch of more than 1 s in which"
            " no client's write was acknowledged, from the fault to the first acknowledged write after it"
        ),
        "notes": [f"{len(verdicts)} runs in a {minutes:g}-minute budget; load average {load}", *failed],
        "data": {"runs": [{k: v for k, v in run.items() if k != "kept"} for run in verdicts], "load_average": load},
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"

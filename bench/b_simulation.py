"""The replica group's simulator: how many schedules a minute on one core, how much it covers, how fast it replays.

Runs `tests/simulation` (the real `ReplicaCore` under a model of Apache
Pulsar) in this process, on one core:

- schedules a minute, at the length `make test` runs (20 virtual seconds,
  three replicas, five clients) and at a short length (5 virtual seconds);
- distinct fault combinations those schedules drew, and how many failed
  (any failure is printed with the command that replays it);
- how long from a failing seed to its replay: a known bad variant's first
  failing seed, replayed;
- the time the core takes to decide one event (p50, p99), over every call
  the drivers made in a few schedules.

No broker, no network: a pure CPU figure.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .common import Workdirs

NAME = "simulation"
ROOT = Path(__file__).resolve().parent.parent


def _simulation() -> Any:
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    import simulation

    return simulation


def rate(simulation: Any, first: int, count: int, seconds: float) -> dict[str, Any]:
    started = time.perf_counter()
    combinations: Counter[str] = Counter()
    failed = []
    for seed in range(first, first + count):
        verdict, _ = simulation.run(seed, seconds=seconds)
        combinations[verdict.faults] += 1
        if not verdict.ok:
            failed.append(verdict.replay())
    took = time.perf_counter() - started
    return {
        "count": count,
        "per_minute": round(count / took * 60),
        "combinations": len(combinations),
        "failed": failed,
    }


def porcupine(simulation: Any, first: int, count: int) -> dict[str, Any]:
    """The fault suite's linearizability checker over each schedule's whole history (timed apart from the runs)."""
    from faults.build import build
    from simulation.check import linearizable

    lincheck, where = build().lincheck, Path(tempfile.mkdtemp(prefix="bench-simulation-"))
    verdicts: Counter[str] = Counter()
    took = 0.0
    for seed in range(first, first + count):
        _, world = simulation.run(seed)
        started = time.perf_counter()
        verdicts[str(linearizable(world, lincheck, where).get("verdict"))] += 1
        took += time.perf_counter() - started
    return {"verdicts": dict(verdicts), "ms_each": round(took / count * 1000, 1)}


def decision_times(simulation: Any, seeds: range) -> dict[str, float]:
    """Every call into the core during `seeds`, timed (the core's public methods, wrapped for the run)."""
    from discovery.replicas.core import ReplicaCore

    samples: list[float] = []
    names = [
        "standby_look",
        "active_look",
        "confirm",
        "on_held",
        "entry",
        "executed",
        "on_appended",
        "on_marker",
        "saw",
    ]
    originals = {name: getattr(ReplicaCore, name) for name in names}

    def timed(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                return method(*args, **kwargs)
            finally:
                samples.append(time.perf_counter_ns() - started)

        return call

    try:
        for name, method in originals.items():
            setattr(ReplicaCore, name, timed(method))
        for seed in seeds:
            simulation.run(seed)
    finally:
        for name, method in originals.items():
            setattr(ReplicaCore, name, method)
    samples.sort()
    return {
        "events": len(samples),
        "p50_us": round(statistics.median(samples) / 1000, 2),
        "p99_us": round(samples[int(len(samples) * 0.99)] / 1000, 2),
    }


def replay_time(simulation: Any) -> dict[str, Any]:
    """A known bad variant's first failing seed, and how long its replay takes."""
    for seed in range(1, 200):
        verdict, _ = simulation.run(seed, variant="no-confirm")
        if not verdict.ok:
            started = time.perf_counter()
            again, world = simulation.run(seed, variant="no-confirm")
            took = time.perf_counter() - started
            return {"seed": seed, "seconds": round(took, 3), "same": again.findings == verdict.findings}
    return {"seed": None, "seconds": None, "same": False}


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    simulation = _simulation()
    count = 60 if quick else 600
    full = rate(simulation, 100_000, count, 20.0)
    short = rate(simulation, 200_000, count, 5.0)
    decided = decision_times(simulation, range(1, 4 if quick else 11))
    checked = porcupine(simulation, 300_000, 20 if quick else 200)
    replay = replay_time(simulation)
    rows: list[dict[str, Any]] = [
        {
            "figure": "simulated schedules a minute, one core (20 virtual s, 3 replicas, 5 clients)",
            "ours": full["per_minute"],
            "target": ">= 10,000",
            "met": full["per_minute"] >= 10_000,
        },
        {
            "figure": "simulated schedules a minute, one core (5 virtual s)",
            "ours": short["per_minute"],
            "target": ">= 10,000",
            "met": short["per_minute"] >= 10_000,
        },
        {
            "figure": f"distinct fault combinations in {count} schedules (20 s; 5 s)",
            "ours": f"{full['combinations']}; {short['combinations']}",
        },
        {
            "figure": f"schedules that broke a promise, of {2 * count}",
            "ours": len(full["failed"]) + len(short["failed"]),
            "target": "0",
            "met": not full["failed"] and not short["failed"],
        },
        {
            "figure": f"porcupine's verdicts on {sum(checked['verdicts'].values())} whole histories (time each)",
            "ours": f"{checked['verdicts']} ({checked['ms_each']} ms)",
            "target": "all ok",
            "met": set(checked["verdicts"]) == {"ok"},
        },
        {
            "figure": "from a failing seed to its replay (no-confirm variant)",
            "ours": f"{replay['seconds']} s (seed {replay['seed']}, same findings: {replay['same']})",
        },
        {
            "figure": f"the core deciding one event, p50 / p99 ({decided['events']:,} events)",
            "ours": f"{decided['p50_us']} / {decided['p99_us']}",
            "unit": "us",
        },
    ]
    return {
        "name": NAME,
        "title": "The replica group's rules under the deterministic simulator",
        "rows": rows,
        "failed_seeds": full["failed"] + short["failed"],
    }

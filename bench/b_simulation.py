"""The replica group's simulator: how many schedules a minute on one core, how much it covers, how fast it replays.

Runs `tests/simulation` (the real `ReplicaCore` under a model of Apache
Pulsar) in this process, on one core:

- schedules a minute at the length `make test` runs (20 virtual seconds of
  faults and clients, then 6 more for the clients' last answers: 26 in all;
  three replicas, five clients; 1 to 3 of the 11 kinds of fault each, a key
  rotation or a replica with the wrong key or none in some), by the
  process's CPU time (what one core does) and by the wall clock (what a
  shared machine gave); and at 10 virtual seconds, the shortest that still
  leaves a fault time to force a takeover before the faults heal;
- what a CI run covers: the fixed schedules of `test_simulated_group.py` and
  as many fresh ones as it runs in its 20 seconds, the distinct fault
  combinations among them, and whether each bad variant is caught in them;
- how long from a failing seed to its replay: a known bad variant's first
  failing seed, replayed;
- the time the core takes to decide one event (p50, p99), over every call
  the drivers made in a few schedules;
- where a schedule's time goes, by part (a profile of a few schedules, its
  shares applied to the unprofiled CPU time of one), and the steps it runs,
  by kind (what the clock jumps to: a client's operation, a delivery, a
  replica's poll of the log, a look, a status).

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
    """`count` schedules from seed `first`: schedules a minute by CPU time and by wall clock, what they drew."""
    started, cpu = time.perf_counter(), time.process_time()
    combinations: Counter[str] = Counter()
    failed = []
    for seed in range(first, first + count):
        verdict, _ = simulation.run(seed, seconds=seconds)
        combinations[verdict.faults] += 1
        if not verdict.ok:
            failed.append(verdict.replay())
    took, used = time.perf_counter() - started, time.process_time() - cpu
    return {
        "count": count,
        "per_minute": round(count / used * 60),
        "wall_per_minute": round(count / took * 60),
        "ms_each": round(used / count * 1000, 1),
        "combinations": len(combinations),
        "failed": failed,
    }


def ci_run(simulation: Any) -> dict[str, Any]:
    """What the make-test run of `test_simulated_group.py` checks: its fixed schedules, then fresh ones for its fixed
    time (as many as this machine runs in it), and the bad variants it must catch among the fixed ones."""
    from simulation.test_simulated_group import FIXED, FRESH_SECONDS
    from simulation.variants import VARIANTS

    started, combinations, failed = time.perf_counter(), set(), []
    for seed in FIXED:
        verdict, _ = simulation.run(seed)
        combinations.add(verdict.faults)
        failed += [] if verdict.ok else [verdict.replay()]
    fixed = len(combinations)
    deadline, seed = time.monotonic() + FRESH_SECONDS, 10**9
    while time.monotonic() < deadline:
        verdict, _ = simulation.run(seed)
        combinations.add(verdict.faults)
        failed += [] if verdict.ok else [verdict.replay()]
        seed += 1
    caught = {}
    for variant in VARIANTS:
        first = next((s for s in FIXED if not simulation.run(s, variant=variant)[0].ok), None)
        caught[variant] = first
    return {
        "fixed": len(FIXED),
        "fresh": seed - 10**9,
        "fixed_combinations": fixed,
        "combinations": len(combinations),
        "failed": failed,
        "caught": caught,
        "seconds": round(time.perf_counter() - started, 1),
    }


PARTS = {
    "the core (ReplicaCore, its key witness and wholeness)": ("discovery/replicas/core/replica.py", "wholeness.py"),
    "MACs: signing each record once, checking it once per key": ("groupkey.py", "hmac.py", "records.py", "keys.py"),
    "JSON of each record written": ("json/",),
    "the drivers (replica.py, variants.py) and the model broker": ("simulation/replica.py", "variants.py", "broker.py"),
    "clients, faults, dispatch, the clock (world.py, random, heapq)": ("simulation/world.py", "random.py", "heapq"),
    "the cheap checks, every schedule (check.py, faults/check.py)": ("simulation/check.py", "faults/check.py"),
}


RUN_ITSELF = {"later", "plan", "_tear_down", "<listcomp>"}
"""What `World.run` calls to set a schedule up and tear it down: not steps."""


def breakdown(simulation: Any, seeds: range, ms_each: float) -> tuple[dict[str, float], dict[str, float]]:
    """Where a schedule's CPU time goes: each part's share of a profile of `seeds` (time in a function itself,
    grouped by the file it is in; a builtin's by its callers'), applied to `ms_each`, the unprofiled time of one
    schedule; and the steps a schedule runs, by kind (the calls `World.run` makes, each a step the clock jumped to,
    per schedule)."""
    import cProfile
    import pstats

    profile = cProfile.Profile(time.process_time)
    profile.runcall(lambda: [simulation.run(seed) for seed in seeds])
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    parts: Counter[str] = Counter()
    steps: Counter[str] = Counter()

    def part_of(path: str, function: str) -> str:
        where = f"{path}:{function}"
        return next((name for name, marks in PARTS.items() if any(m in where for m in marks)), "the rest")

    for (path, _, function), (_, _, own, _, callers) in stats.items():
        for (caller_path, _, caller), (calls, *_) in callers.items():
            if (
                "/simulation/" in path
                and function not in RUN_ITSELF
                and caller_path.endswith("simulation/world.py")
                and caller == "run"
            ):
                steps[function] += calls
        if path != "~":
            parts[part_of(path, function)] += own
            continue
        for (caller_path, _, caller), (_, _, spent, _) in callers.items():  # a builtin: its callers' part
            parts[part_of(caller_path, caller)] += spent
    total = sum(parts.values()) or 1.0
    per = len(seeds) or 1
    return (
        {part: round(ms_each * 1000 * spent / total) for part, spent in parts.most_common()},
        {kind: round(count / per, 1) for kind, count in steps.most_common()},
    )


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
    short = rate(simulation, 200_000, count, 10.0)
    ci = ci_run(simulation)
    decided = decision_times(simulation, range(1, 4 if quick else 11))
    checked = porcupine(simulation, 300_000, 20 if quick else 200)
    replay = replay_time(simulation)
    parts, steps = breakdown(simulation, range(400_000, 400_000 + (5 if quick else 30)), full["ms_each"])
    rows: list[dict[str, Any]] = [
        {
            "figure": "simulated schedules a minute, one core, by CPU time (20 virtual s + 6 s tail, 3 replicas,"
            " 5 clients)",
            "ours": full["per_minute"],
            "target": ">= 10,000",
            "met": full["per_minute"] >= 10_000,
        },
        {
            "figure": "the same by the wall clock (the machine shared)",
            "ours": full["wall_per_minute"],
        },
        {
            "figure": "simulated schedules a minute, one core, by CPU time (10 virtual s + 6 s tail)",
            "ours": short["per_minute"],
            "target": ">= 10,000",
            "met": short["per_minute"] >= 10_000,
        },
        {
            "figure": "CPU time of one schedule (20 virtual s; 10 virtual s)",
            "ours": f"{full['ms_each']}; {short['ms_each']}",
            "unit": "ms",
        },
        {
            "figure": f"distinct fault combinations in {count} schedules (20 s; 10 s)",
            "ours": f"{full['combinations']}; {short['combinations']}",
        },
        {
            "figure": f"schedules that broke a promise, of {2 * count}",
            "ours": len(full["failed"]) + len(short["failed"]),
            "target": "0",
            "met": not full["failed"] and not short["failed"],
        },
        {
            "figure": "a CI run (test_simulated_group.py): schedules checked, fixed + fresh; distinct fault"
            " combinations, fixed alone; wall seconds",
            "ours": f"{ci['fixed']} + {ci['fresh']}; {ci['combinations']}, {ci['fixed_combinations']}; {ci['seconds']}",
            "target": "every schedule keeps every promise",
            "met": not ci["failed"],
        },
        {
            "figure": "a CI run: the first fixed seed failing each bad variant",
            "ours": ", ".join(f"{variant} {seed}" for variant, seed in ci["caught"].items()),
            "target": "each caught",
            "met": None not in ci["caught"].values(),
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
        *(
            {"figure": f"one 20 s schedule's CPU time in {part}", "ours": spent, "unit": "us"}
            for part, spent in parts.items()
        ),
        {
            "figure": "steps one 20 s schedule runs, by kind (each a call the clock jumped to)",
            "ours": f"{round(sum(steps.values())):,}: "
            + ", ".join(f"{kind} {count:,}" for kind, count in list(steps.items())[:10]),
        },
    ]
    return {
        "name": NAME,
        "title": "The replica group's rules under the deterministic simulator",
        "rows": rows,
        "failed_seeds": full["failed"] + short["failed"] + ci["failed"],
    }

"""Run or replay schedules of the simulated replica group.

    python -m simulation --seed 1234 --trace            # one schedule, step by step, and its verdict
    python -m simulation --schedules 2000 --from 1      # many, with figures: schedules a minute, fault combinations
    python -m simulation --variant no-confirm --schedules 300   # a known bad rule: how soon it is caught

Run with tests/ on the path (PYTHONPATH=tests).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

from . import run
from .variants import VARIANTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, help="replay this one schedule")
    parser.add_argument("--from", dest="first", type=int, default=1, help="the first seed of a run of schedules")
    parser.add_argument("--schedules", type=int, default=100, help="how many schedules to run (without --seed)")
    parser.add_argument("--seconds", type=float, default=20.0, help="virtual seconds each schedule runs (default 20)")
    parser.add_argument("--variant", choices=VARIANTS, help="break one rule the way a plausible change would")
    parser.add_argument("--trace", action="store_true", help="print the schedule's steps (with --seed)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args(argv)
    if options.seed is not None:
        verdict, world = run(options.seed, variant=options.variant, seconds=options.seconds)
        if options.trace:
            print("\n".join(world.trace))
        counts = f"{verdict.ops} operations, {verdict.acknowledged} acknowledged"
        print(f"seed {verdict.seed}: faults {verdict.faults}; {counts}")
        for name, lines in verdict.findings.items():
            print(f"  {name}:")
            for line in lines[:10]:
                print(f"    {line}")
        print("ok" if verdict.ok else "FAILED")
        return 0 if verdict.ok else 1
    started = time.perf_counter()
    failed: list[object] = []
    combinations: Counter[str] = Counter()
    for seed in range(options.first, options.first + options.schedules):
        verdict, _ = run(seed, variant=options.variant, seconds=options.seconds)
        combinations[verdict.faults] += 1
        if not verdict.ok:
            failed.append(verdict)
            print(
                f"seed {seed} FAILED ({', '.join(verdict.findings)}): {verdict.replay(options.variant)}",
                file=sys.stderr,
            )
    seconds = time.perf_counter() - started
    figures = {
        "schedules": options.schedules,
        "failed": len(failed),
        "seconds": round(seconds, 2),
        "schedules_per_minute": round(options.schedules / seconds * 60),
        "fault_combinations": len(combinations),
        "variant": options.variant,
    }
    print(json.dumps(figures) if options.json else "\n".join(f"{k}: {v}" for k, v in figures.items()))
    return 1 if failed and options.variant is None else 0


if __name__ == "__main__":
    sys.exit(main())

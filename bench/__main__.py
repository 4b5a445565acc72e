"""`python -m bench` (what `make bench` runs): every benchmark, its reference, one table.

    python -m bench                  # all fourteen, about 8 minutes on 2 cores
    python -m bench --quick          # smaller counts: a smoke test in about a minute
    python -m bench --only death     # one benchmark (repeat --only for several)
    python -m bench --only fleet     # opt-in: 100,000 instances on one registry, about 5 minutes more
    python -m bench --only faults    # opt-in: the replicated store under faults, checked, for 30 minutes

Runs against fresh embedded brokers; with `BENCH_BROKER=apache-pulsar`,
against a real Apache Pulsar 4.0 standalone it starts itself (scripts/apache_pulsar.py,
one for the whole run, tenant `tg` made for it); or against the broker
`PULSAR_URL` names (give it a cluster of its own: the benchmarks start their
own config store and registry on the well-known topics). Writes
`results-<broker>.json` beside this file unless `--out` says otherwise, and
renders `RESULTS.md` from every broker's latest results there, side by side.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from toolservice_base import configure_logging
from toolservice_base.topics import DEFAULT_TOPICSPACE

from . import common, report
from .common import PROFILE_ENV, Workdirs, run

Benchmark = Callable[[Workdirs, bool], Awaitable[dict[str, Any]]]

BENCHMARKS: dict[str, str] = {
    "propagation": "bench.b_propagation",
    "death": "bench.b_death",
    "invoke": "bench.b_invoke",
    "throughput": "bench.b_throughput",
    "reload": "bench.b_reload",
    "scale": "bench.b_scale",
    "trustgraph": "bench.b_trustgraph",
    "mcp": "bench.b_mcp",
    "limits": "bench.b_limits",
    "stages": "bench.b_stages",
    "rich": "bench.b_rich",
    "sidecar": "bench.b_sidecar",
    "front": "bench.b_front",
    "search": "bench.b_search",
    "deltas": "bench.b_deltas",
}
"""Name -> module with `run(work, quick)`, in the order they run."""

OPT_IN: dict[str, str] = {
    "fleet": "bench.b_fleet",
    "faults": "bench.b_faults",
    "simulation": "bench.b_simulation",
}
"""Benchmarks run only when named with `--only`: too long for the default run. A full run keeps their latest
results in `results-<broker>.json` (and so in RESULTS.md)."""

ALL: dict[str, str] = {**BENCHMARKS, **OPT_IN}


def load(name: str) -> Benchmark:
    run: Benchmark = importlib.import_module(ALL[name]).run
    return run


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts and shorter runs (a smoke test)")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(ALL),
        metavar="NAME",
        help=f"run only this benchmark; repeatable ({', '.join(BENCHMARKS)}; opt-in, run only when named: "
        f"{', '.join(OPT_IN)})",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="sample with py-spy into DIR: the registry (throughput, scale, fleet), the echo service and the "
        "bridge during sequential calls (invoke); slows what it samples",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent,
        help="where results-<broker>.json and RESULTS.md go (default: bench/)",
    )
    return parser.parse_args(argv)


async def run_all(names: list[str], quick: bool) -> list[dict[str, Any]]:
    work = Workdirs()
    results = []
    try:
        for name in names:
            started = time.monotonic()
            try:
                result = await load(name)(work, quick)
            except Exception as exc:  # one broken benchmark must not hide the others' figures
                traceback.print_exc()
                result = {
                    "name": name,
                    "title": "failed",
                    "error": f"{type(exc).__name__}: {exc}",
                    "rows": [{"figure": "benchmark failed", "ours": f"{type(exc).__name__}: {exc}"[:80], "met": False}],
                }
            result["seconds"] = round(time.monotonic() - started, 1)
            results.append(result)
    finally:
        work.cleanup()
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    configure_logging("error")
    names = args.only or list(BENCHMARKS)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        os.environ[PROFILE_ENV] = str(args.profile.resolve())
    kind = os.environ.get("BENCH_BROKER", "pulsar-lite")
    if kind not in ("pulsar-lite", "apache-pulsar"):
        print(f"bench: BENCH_BROKER={kind!r}: use pulsar-lite (default) or apache-pulsar", file=sys.stderr)
        return 2
    apache = _start_apache_pulsar() if kind == "apache-pulsar" else None
    try:
        started = time.monotonic()
        results = run(run_all(names, args.quick))
        wall = time.monotonic() - started
    finally:
        if apache is not None:
            apache.stop()
    if apache is not None:
        broker, key = (
            f"Apache Pulsar {apache_version()} standalone (scripts/apache_pulsar.py), one for the run",
            "apache-pulsar",
        )
    elif os.environ.get("PULSAR_URL"):
        broker, key = "the broker PULSAR_URL names", "external"
    else:
        broker, key = "embedded pulsar-lite, a fresh one per benchmark", "pulsar-lite"
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = report.write(
        results, args.out, argv, wall, broker, key, partial=list(ALL) if args.only else None, keep=list(OPT_IN)
    )
    print()
    print(report.table(results))
    print(
        f"\n{len(results)} benchmark(s) in {wall:.0f} s; wrote {json_path.name} and {md_path.name} in {args.out.name}/"
    )
    failed = [r["name"] for r in results if "error" in r]
    return 1 if failed else 0


def apache_version() -> str:
    from apache_pulsar import VERSION

    return str(VERSION)


def _start_apache_pulsar() -> Any:
    """A real Apache Pulsar for the whole run, reached as an external broker by every benchmark."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from apache_pulsar import PRODUCT_NAMESPACES, ApachePulsar

    apache = common.APACHE_PULSAR = ApachePulsar().start()
    apache.create_tenant(DEFAULT_TOPICSPACE, (*PRODUCT_NAMESPACES, "bench"))  # `bench`: the references' scratch topics
    os.environ.update(PULSAR_URL=apache.url, TOOLREG_BROKER="apache-pulsar")
    return apache


if __name__ == "__main__":
    raise SystemExit(main())

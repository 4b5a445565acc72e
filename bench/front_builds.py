"""The MCP fronts of two builds in one run: `python -m bench.front_builds OTHER_ROOT [--rounds N] [--burst N]`.

The front benchmark (`bench.b_front`) compares one build's front with the bare SDK server; on a shared machine a
run's calls/s ratio moves with whatever else runs, more than most changes to the front do. This runs the front of
this checkout and of another one (`OTHER_ROOT`, a checkout of the same repository at another commit) against the
same broker, echo service and bare SDK server, bursts interleaved round by round (4 sessions x 8 in flight each),
and prints each round's calls/s, each path's median ratio to the bare server, and the CPU per call of each server
process over all its bursts.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from .b_front import Connect, _connect, _rate, _until_listed
from .common import CpuPerCall, Stack, Workdirs, free_port, run, spawn


async def main(other: Path, rounds: int, burst: int) -> None:
    work = Workdirs()
    stack = Stack(work.make("front-builds")).start()
    try:
        stack.processes["echo"] = spawn(["-m", "bench.serve", "--id", "echo"], stack.env(), stack.workdir / "echo.log")
        ports = {"other": free_port(), "this": free_port(), "reference": free_port()}
        stack.processes["other"] = spawn(
            ["-m", "discovery.cli", "mcp", "--http", f"127.0.0.1:{ports['other']}"],
            stack.env(PYTHONPATH=str(other)),
            stack.workdir / "mcp-other.log",
            cwd=other,
        )
        stack.processes["this"] = spawn(
            ["-m", "discovery.cli", "mcp", "--http", f"127.0.0.1:{ports['this']}"],
            stack.env(),
            stack.workdir / "mcp.log",
        )
        stack.processes["reference"] = spawn(
            ["-m", "bench.front_reference", "--port", str(ports["reference"])], stack.env(), stack.workdir / "ref.log"
        )
        paths: dict[str, Connect] = {name: _connect(f"http://127.0.0.1:{port}/mcp") for name, port in ports.items()}
        for connect in paths.values():
            await _until_listed(connect)
        meters = {name: CpuPerCall({"server": stack.processes[name].pid}) for name in paths}
        for connect in paths.values():  # warm-up
            await _rate(connect, 400)
        rates: dict[str, list[float]] = {name: [] for name in paths}
        for number in range(rounds):
            order = list(paths) if number % 2 == 0 else list(reversed(paths))
            for name in order:
                with meters[name].over(burst):
                    rates[name].append(await _rate(paths[name], burst))
            each = ", ".join(f"{name} {rate[-1]:.0f}" for name, rate in rates.items())
            print(f"round {number + 1}: calls/s {each}; load {os.getloadavg()[0]:.2f}", flush=True)
        for name in ("other", "this"):
            ratios = [a / b for a, b in zip(rates[name], rates["reference"], strict=True)]
            print(
                f"{name}: ratio to the bare server by round {[round(r, 2) for r in ratios]}, "
                f"median {statistics.median(ratios):.3f}; CPU per call {meters[name].figures()['server']} us"
            )
        print(f"reference: CPU per call {meters['reference'].figures()['server']} us")
    finally:
        stack.stop()
        work.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the root of another checkout of this repository")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--burst", type=int, default=800, help="calls per path per round")
    args = parser.parse_args()
    run(main(args.other.resolve(), args.rounds, args.burst))

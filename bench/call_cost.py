"""What one call costs in CPU, each side, ours against the bare client: `python -m bench.call_cost`.

Wall-clock figures on a shared 2-core machine move with everything else that
runs there; the CPU a call costs each process moves far less, and at 64
calls in flight it is what bounds calls/s (a process on one core answers at
most one call per its CPU per call). This runs the invoke benchmark's two
pairs on one embedded pulsar-lite (or the broker `PULSAR_URL` names, with
`TOOLREG_BROKER`) and reads, with psutil, the CPU time of every process
involved, all threads:

- ours: `ToolSet.invoke` in this process against the echo `DynamicToolService`
  (`bench.serve`) in its own;
- bare: `raw.listener_rtt` in this process against `raw listener-responder`
  in its own, waiting for each send's receipt as the invoke benchmark's
  reference does, and again without (`send_async` with no callback: the
  fastest path the client offers).

    python -m bench.call_cost                       # sequential and 64 in flight, a JSON summary
    python -m bench.call_cost --spy DIR             # and py-spy profiles of both sides of ours, sequential and at 64
    python -m bench.profile_summary DIR/ours-bridge-64.txt --thread MainThread --layers
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from agent_bridge import ToolSet
from toolservice_base import configure_logging, open_transport
from toolservice_base.schemas import ToolServiceRequest

from . import raw
from .b_death import Watch
from .b_invoke import LISTENER_REQUEST, LISTENER_RESPONSE, TEXT
from .common import PROFILE_ENV, Stack, Workdirs, run, sampled, spawn, wait_for_line


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


@contextlib.contextmanager
def _spied(spy: Path | None, pids: dict[str, int]) -> Iterator[None]:
    if spy is None:
        yield
        return
    os.environ[PROFILE_ENV] = str(spy.resolve())
    with contextlib.ExitStack() as stack:
        for name, pid in pids.items():
            stack.enter_context(sampled(pid, name))
        yield


async def _measured(
    caller: Callable[[], Awaitable[int]], peer: int, spy: Path | None, names: tuple[str, str]
) -> dict[str, float]:
    me, other = psutil.Process(), psutil.Process(peer)
    with _spied(spy, {names[0]: os.getpid(), names[1]: peer}):
        mine, theirs, started = _cpu(me), _cpu(other), time.perf_counter()
        calls = await caller()
        elapsed = time.perf_counter() - started
        mine, theirs = _cpu(me) - mine, _cpu(other) - theirs
    return {
        "calls": calls,
        "calls_per_s": round(calls / elapsed, 1),
        "caller_us_per_call": round(mine / calls * 1e6, 1),
        "responder_us_per_call": round(theirs / calls * 1e6, 1),
        "caller_cpu_share": round(mine / elapsed, 3),
        "responder_cpu_share": round(theirs / elapsed, 3),
    }


async def _ours(tools: ToolSet, concurrency: int, calls: int) -> int:
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await tools.invoke("bench-echo", {"text": TEXT})

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return calls


async def main(calls: int, spy: Path | None) -> dict[str, Any]:
    work = Workdirs()
    stack = Stack(work.make("call-cost"), registry=True).start()
    try:
        service = spawn(["-m", "bench.serve", "--id", "bench-echo"], stack.env(), stack.workdir / "echo.log")
        stack.processes["echo"] = service
        responder = spawn(
            ["-m", "bench.raw", "listener-responder", stack.url, LISTENER_REQUEST, LISTENER_RESPONSE],
            stack.env(),
            stack.workdir / "raw-listener.log",
        )
        stack.processes["raw-listener"] = responder
        wait_for_line(stack.workdir / "raw-listener.log", "raw responder ready", responder)
        payload = ToolServiceRequest(user="", config="{}", arguments=json.dumps({"text": TEXT})).model_dump_json()
        connection = await open_transport(stack.settings)
        figures: dict[str, Any] = {"load_average": [round(x, 2) for x in os.getloadavg()]}
        try:
            async with ToolSet(settings=stack.settings, connection=connection) as tools:
                await Watch(tools).listed(["bench-echo"])
                await _ours(tools, 1, 200)  # warm-up
                for concurrency, count in ((1, calls // 5), (64, calls)):
                    figures[f"ours_{concurrency}"] = await _measured(
                        lambda c=concurrency, n=count: _ours(tools, c, n),  # type: ignore[misc]
                        service.pid,
                        spy,
                        (f"ours-bridge-{concurrency}", f"ours-service-{concurrency}"),
                    )
                    for receipts in (True, False):

                        async def bare(c: int = concurrency, n: int = count, r: bool = receipts) -> int:
                            done, _, _ = await raw.listener_rtt(
                                stack.url,
                                LISTENER_REQUEST,
                                LISTENER_RESPONSE,
                                payload.encode(),
                                c,
                                600,
                                max_calls=n,
                                receipts=r,
                            )
                            return done

                        key = f"bare_{concurrency}" + ("" if receipts else "_no_receipts")
                        figures[key] = await _measured(bare, responder.pid, None, ("bare-caller", "bare-responder"))
        finally:
            await connection.close()
        figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        return figures
    finally:
        stack.stop()
        work.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.call_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000, help="calls at 64 in flight (a fifth of it sequential)")
    parser.add_argument(
        "--spy", type=Path, default=None, metavar="DIR", help="py-spy profiles of ours (sequential and at 64) into DIR"
    )
    args = parser.parse_args()
    configure_logging("error")
    if args.spy is not None:
        args.spy.mkdir(parents=True, exist_ok=True)
    print(json.dumps(run(main(args.calls, args.spy)), indent=1))

"""What tracing costs a call: `ToolSet.invoke` p50 with no OpenTelemetry SDK vs the SDK with an in-memory exporter.

    python -m bench.tracing_cost                 # 6 rounds x 400 calls per mode, ~1 minute on 2 cores
    python -m bench.tracing_cost --rounds 2 --calls 100

One run, one broker, one config store and registry (`toolreg up`). Each
round starts two fresh worker processes one after the other, `none` then
`sdk` (the order flips every round): each runs an echo `DynamicToolService`
and a `ToolSet` in one process and times sequential `invoke`s, so with the
SDK both ends of every call are traced (a client and a server span, exported
synchronously by `SimpleSpanProcessor` into an `InMemorySpanExporter`: the
dearest way to record). A worker is a process of its own because the global
tracer provider can be set once per process. Samples of all rounds are
pooled per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from agent_bridge import ToolSet
from toolservice_base import configure_logging, open_transport

from .common import Stack, Workdirs, summary_ms
from .serve import echo_class

MODES = ("none", "sdk")
TEXT = "hello, tool"


async def worker(mode: str, service_id: str, calls: int, warmup: int) -> dict[str, Any]:
    exporter = None
    if mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    service = echo_class(service_id)(ttl=15.0)
    await service.start()
    connection = await open_transport(service.settings)
    try:
        async with ToolSet(settings=service.settings, connection=connection) as tools:
            await tools.wait_for(lambda t: service_id in t.names(), timeout=30)
            for _ in range(warmup):
                await tools.invoke(service_id, {"text": TEXT})
            if exporter is not None:
                exporter.clear()
            samples = []
            for _ in range(calls):
                started = time.perf_counter()
                await tools.invoke(service_id, {"text": TEXT})
                samples.append(time.perf_counter() - started)
            await asyncio.sleep(0.2)  # the last server spans end after their answer was sent
    finally:
        await connection.close()
        await service.stop()
    spans = len(exporter.get_finished_spans()) if exporter is not None else 0
    return {"mode": mode, "samples": samples, "spans": spans}


def run_worker(stack: Stack, mode: str, service_id: str, calls: int, warmup: int) -> dict[str, Any]:
    args = [sys.executable, "-m", "bench.tracing_cost", "worker", mode, service_id, str(calls), str(warmup)]
    done = subprocess.run(args, env=stack.env(), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} worker failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=400, help="timed calls per worker (after --warmup untimed ones)")
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args(argv)
    work = Workdirs()
    stack = Stack(work.make("tracing"), registry=True).start()
    pooled: dict[str, list[float]] = {mode: [] for mode in MODES}
    spans: dict[str, int] = {mode: 0 for mode in MODES}
    try:
        for number in range(args.rounds):
            order = MODES if number % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                result = run_worker(stack, mode, f"trace-echo-{number}-{mode}", args.calls, args.warmup)
                pooled[mode] += result["samples"]
                spans[mode] += result["spans"]
                print(
                    f"round {number + 1}/{args.rounds} {mode}: p50 {summary_ms(result['samples'])['p50_ms']:.3f} ms",
                    file=sys.stderr,
                )
    finally:
        stack.stop()
        work.cleanup()
    summaries = {mode: summary_ms(samples) for mode, samples in pooled.items()}
    base, traced = summaries["none"]["p50_ms"], summaries["sdk"]["p50_ms"]
    print(f"ToolSet.invoke, {len(pooled['none'])} sequential calls per mode, echo service in the same process")
    print(f"{'mode':<32}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'spans':>8}")
    for mode, label in (("none", "no SDK configured"), ("sdk", "SDK + in-memory exporter")):
        s = summaries[mode]
        print(f"{label:<32}{s['p50_ms']:>10.3f}{s['p95_ms']:>10.3f}{s['p99_ms']:>10.3f}{spans[mode]:>8}")
    print(f"tracing adds {traced - base:+.3f} ms to p50 ({(traced / base - 1) * 100:+.1f} %)")
    print(json.dumps({"summaries": summaries, "spans": spans}))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        configure_logging("warning", json=True)
        mode, service_id, calls, warmup = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        os.environ.pop("OTEL_TRACES_EXPORTER", None)
        print(json.dumps(asyncio.run(worker(mode, service_id, calls, warmup))))
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))

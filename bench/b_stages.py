"""10. Where announce -> invokable spends its time: one timestamp per stage of the path, per start.

    python -m bench --only stages                 # pulsar-lite
    BENCH_BROKER=apache-pulsar python -m bench --only stages

The store, the registry, the service and the agent's `ToolSet` run in this
process, each on a Pulsar client of its own (as separate processes would
have), so every stage can be stamped where it happens, with one clock and no
product code changed: the bench wraps the methods that mark a stage. Each
cycle starts an echo service, waits for the first `ToolSet.invoke` to
answer, then stops it and waits until the tool is gone, as benchmark 1 does.

Stages, in the order a start goes through them:

    start() called -> announce sent -> announce received by the registry ->
    merged (the store write sent) -> write received by the store -> committed
    (SQLite) -> push sent -> push received by the ToolSet -> read answered ->
    tools swapped -> first call answered

The figure for each stage is the time from the stage before it. The one
shared event loop makes this a slightly optimistic picture of separate
processes (no process hop on the loop side); the end-to-end total is shown
beside benchmark 1's, which runs the store and registry in `toolreg up`.

Then the same cycles again with 10, 100, 1,000 and 10,000 static tools
already listed (in the store and in the `ToolSet`): how the path, its
slowest stage and stop() -> gone grow with the number of tools.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from typing import Any

from agent_bridge import ToolSet
from agent_bridge.reload import Reloader
from discovery.broker import EmbeddedBroker
from discovery.registry.intake import Intake
from discovery.registry.service import Registry, RegistryOptions
from discovery.registry.store_writes import StoreWrites
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, open_transport
from toolservice_base.announcer import Announcer

from .common import Progress, Workdirs, summary_ms
from .serve import echo_class

NAME = "stages"
SIZES = (10, 100, 1_000, 10_000)
SIZES_QUICK = (10, 1_000)
STATIC_SERVICE = {
    "id": "bulk",
    "request-queue": "non-persistent://tg/request/bulk",
    "response-queue": "non-persistent://tg/response/bulk",
}
STAGES = (
    "announce sent",
    "received by the registry",
    "merged (store write sent)",
    "write received by the store",
    "committed in the store",
    "push sent",
    "push received by the ToolSet",
    "read answered",
    "tools swapped",
    "first call answered",
)


class Marks:
    """The first time each stage is reached in the current cycle (perf_counter seconds)."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.at: dict[str, float] = {}

    def begin(self) -> None:
        self.t0, self.at = time.perf_counter(), {}

    def mark(self, stage: str) -> None:
        """Stamp `stage` the first time it is reached after the stage before it (an earlier read or heartbeat is not
        it)."""
        index = STAGES.index(stage)
        if self.t0 is not None and stage not in self.at and (index == 0 or STAGES[index - 1] in self.at):
            self.at[stage] = time.perf_counter()

    def missing(self) -> str | None:
        """The first stage this cycle did not reach after the one before it, if any."""
        return next((stage for stage in STAGES if stage not in self.at), None)

    def deltas(self) -> dict[str, float] | None:
        """Each stage's time from the one before; None if a stage was not seen (a cycle that took another path)."""
        if self.t0 is None or self.missing() is not None:
            return None
        out, previous = {}, self.t0
        for stage in STAGES:
            out[stage] = self.at[stage] - previous
            previous = self.at[stage]
        return out


@contextmanager
def stamped(marks: Marks) -> Iterator[None]:
    """Wrap the methods that mark a stage, and put them back afterwards."""
    patches: list[tuple[type, str, Callable[..., Any]]] = []

    def wrap(
        owner: type,
        name: str,
        before: str | None = None,
        after: str | None = None,
        when: Callable[..., bool] = lambda *a, **k: True,
    ) -> None:
        original = getattr(owner, name)
        patches.append((owner, name, original))
        if inspect.iscoroutinefunction(original):

            @functools.wraps(original)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if before and when(*args, **kwargs):
                    marks.mark(before)
                result = await original(*args, **kwargs)
                if after and when(*args, **kwargs):
                    marks.mark(after)
                return result

            setattr(owner, name, async_wrapper)
        else:

            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if before:
                    marks.mark(before)
                result = original(*args, **kwargs)
                if after:
                    marks.mark(after)
                return result

            setattr(owner, name, wrapper)

    # Stamped on entry where the next stage can start before the call returns (a send whose message is already on its
    # way).
    wrap(Announcer, "_send", before="announce sent", when=lambda self, kind: kind == "announce")
    wrap(Intake, "on_message", before="received by the registry")
    wrap(StoreWrites, "apply", before="merged (store write sent)")
    wrap(ConfigStoreService, "_handle", before="write received by the store")
    wrap(ConfigStoreService, "_execute", after="committed in the store")
    wrap(ConfigStoreService, "_push", before="push sent")
    wrap(Reloader, "_on_push", before="push received by the ToolSet")
    wrap(Reloader, "_read", after="read answered")
    wrap(Reloader, "_apply_locked", after="tools swapped")
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    starts = 20 if quick else 200
    progress = Progress(NAME)
    workdir = work.make(NAME)
    marks = Marks()
    async with AsyncExitStack() as stack:
        url = os.environ.get("PULSAR_URL")
        broker_kind = os.environ.get("TOOLREG_BROKER") or "apache-pulsar"
        if not url:
            broker = EmbeddedBroker(workdir / "broker")
            url = broker.start()
            stack.callback(broker.stop)
            broker_kind = "pulsar-lite"
        settings = Settings(data_dir=workdir / "data", pulsar_url=url, broker=broker_kind)
        stack.enter_context(stamped(marks))
        connections = []
        for _ in range(4):  # store, registry, service, agent: a client each, as four processes would have
            connection = await open_transport(settings)
            stack.push_async_callback(connection.close)
            connections.append(connection)
        store_conn, registry_conn, service_conn, agent_conn = connections
        await stack.enter_async_context(ConfigStoreService.in_data_dir(store_conn, settings.data_dir))
        registry = Registry(registry_conn, options=RegistryOptions(sweep_interval=0.25))
        await stack.enter_async_context(registry)
        tools = await stack.enter_async_context(ToolSet(settings=settings, connection=agent_conn, poll_interval=2.0))
        cycles, totals, _ = await _cycles(settings, service_conn, tools, marks, starts, progress)
        growth = await _growth(
            settings,
            store_conn,
            service_conn,
            tools,
            marks,
            SIZES_QUICK if quick else SIZES,
            10 if quick else 40,
            progress,
        )
    per_stage = {stage: summary_ms([c[stage] for c in cycles]) for stage in STAGES}
    total = summary_ms(totals)
    progress.done(f"{len(cycles)} of {starts} starts went through every stage: total p50 {total['p50_ms']:.1f} ms")
    rows = [{"figure": f"stage: {stage}, p50", "ours": per_stage[stage]["p50_ms"], "unit": "ms"} for stage in STAGES]
    rows.append({"figure": "all stages, start() -> first call answered, p50", "ours": total["p50_ms"], "unit": "ms"})
    rows.append({"figure": "all stages, start() -> first call answered, p99", "ours": total["p99_ms"], "unit": "ms"})
    for size, figures in growth.items():
        rows.append(
            {
                "figure": f"with {size:,} tools already listed: start() -> first call answered, p50",
                "ours": figures["invokable"]["p50_ms"],
                "unit": "ms",
            }
        )
        slowest = figures["slowest"]
        rows.append(
            {
                "figure": f"with {size:,} tools already listed: slowest stage at p50",
                "ours": (
                    f"{slowest} {figures['per_stage'][slowest]['p50_ms']:.1f} ms"
                    if slowest
                    else (
                        f"none: {figures['complete_cycles']} of {figures['invokable']['n']} starts went through every"
                        " stage in order"
                    )
                ),
            }
        )
        rows.append(
            {
                "figure": f"with {size:,} tools already listed: stop() -> gone from the ToolSet, p50",
                "ours": figures["gone"]["p50_ms"],
                "unit": "ms",
            }
        )
    return {
        "name": NAME,
        "title": "Announce -> invokable, stage by stage",
        "rows": rows,
        "reference_is": (
            "none: each stage is timed from the stage before it; the total sits beside benchmark 1 (propagation), "
            "whose store and registry run in `toolreg up`"
        ),
        "data": {
            "starts": starts,
            "complete_cycles": len(cycles),
            "per_stage": per_stage,
            "total": total,
            "growth": growth,
        },
    }


async def _growth(
    settings: Settings,
    store_conn: Any,
    service_conn: Any,
    tools: ToolSet,
    marks: Marks,
    sizes: tuple[int, ...],
    starts: int,
    progress: Progress,
) -> dict[int, dict[str, Any]]:
    """The same cycles with 10 ... 10,000 static tools already in the store and the ToolSet: how each stage grows."""
    found: dict[int, dict[str, Any]] = {}
    config = await ConfigClient(store_conn).start()
    try:
        listed = 0
        for size in sizes:
            listed = await _list_static(config, listed, size)
            await tools.wait_for(_at_least(size), timeout=120)
            cycles, totals, gone = await _cycles(
                settings, service_conn, tools, marks, starts, progress, f"{size:,} listed: ", pause=0.25
            )
            per_stage = {stage: summary_ms([c[stage] for c in cycles]) for stage in STAGES}
            complete = [stage for stage in STAGES if per_stage[stage]["n"]]
            slowest = max(complete, key=lambda stage: per_stage[stage]["p50_ms"]) if complete else None
            found[size] = {
                "invokable": summary_ms(totals),
                "gone": summary_ms(gone),
                "per_stage": per_stage,
                "slowest": slowest,
                "complete_cycles": len(cycles),
            }
    finally:
        await config.close()
    return found


def _at_least(size: int) -> Callable[[ToolSet], bool]:
    return lambda listed: len(listed) >= size


async def _list_static(config: ConfigClient, listed: int, size: int) -> int:
    """Write static tools until `size` are listed (250 bytes each, one service), in puts of 2,000."""
    if listed == 0:
        await config.put([("tool-service", "bulk", json.dumps(STATIC_SERVICE))])
    for start in range(listed, size, 2_000):
        await config.put([("tool", f"t-{n:05d}", _static_tool(n)) for n in range(start, min(size, start + 2_000))])
    return size


def _static_tool(n: int) -> str:
    return json.dumps(
        {
            "type": "tool-service",
            "name": f"t-{n:05d}",
            "service": "bulk",
            "description": (
                f"Look something up in collection number {n} of the archive, the way an agent would ask for it"
            ),
            "arguments": [{"name": "query", "type": "string", "description": "What to look up"}],
        }
    )


async def _cycles(
    settings: Settings,
    connection: Any,
    tools: ToolSet,
    marks: Marks,
    starts: int,
    progress: Progress,
    label: str = "",
    pause: float = 0.05,
) -> tuple[list[dict[str, float]], list[float], list[float]]:
    """Start, first call, stop, gone; `pause` between cycles lets the last one's writes and reloads end (one shared
    loop)."""
    service_class = echo_class("bench-echo")
    cycles: list[dict[str, float]] = []
    totals: list[float] = []
    gone: list[float] = []
    skipped: Counter[str] = Counter()
    for number in range(starts):
        await asyncio.sleep(pause)
        service = service_class(settings=settings, connection=connection, ttl=15)
        marks.begin()
        await service.start()
        while True:
            if "bench-echo" in tools and await tools.invoke("bench-echo", {"text": "hello"}) == "hello":
                break
            await tools.wait_for(lambda ts: "bench-echo" in ts, timeout=10)
        marks.mark("first call answered")
        assert marks.t0 is not None
        totals.append(time.perf_counter() - marks.t0)
        found = marks.deltas()
        if found is not None:
            cycles.append(found)
        else:
            skipped[marks.missing() or "?"] += 1
        marks.t0 = None  # the stop below is not part of any cycle
        stopping = time.perf_counter()
        await service.stop()
        await tools.wait_for(lambda ts: "bench-echo" not in ts, timeout=30)
        gone.append(time.perf_counter() - stopping)
        progress.update(f"{label}start {number + 1}/{starts}")
    if len(cycles) * 2 < starts:
        stage, times = skipped.most_common(1)[0]
        raise RuntimeError(
            f"{label}only {len(cycles)} of {starts} starts were stamped at every stage; {times} never reached"
            f" {stage!r}: the method `stamped` wraps for it is no longer on the path (renamed or bypassed)"
        )
    return cycles, totals, gone

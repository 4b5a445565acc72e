"""A deterministic simulator of the replica group: the real `ReplicaCore` under a model of Apache Pulsar.

`run(seed)` plays one schedule (faults and clients drawn from the seed) and
judges it (`check`); `python -m simulation --seed N --trace` replays one
step by step. See `world` for what a schedule can do, `broker` for the
model and the tests that hold it to the real broker, `variants` for the bad
rules it must catch.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from .check import findings
from .world import World


@dataclass
class Verdict:
    seed: int
    seconds: float
    faults: str
    findings: dict[str, list[str]]
    ops: int
    acknowledged: int

    @property
    def ok(self) -> bool:
        return not self.findings

    def replay(self, variant: str | None = None) -> str:
        also = f" --variant {variant}" if variant else ""
        also += f" --seconds {self.seconds:g}" if self.seconds != 20.0 else ""
        return f"PYTHONPATH=tests .venv/bin/python -m simulation --seed {self.seed}{also} --trace"


def run(seed: int, *, variant: str | None = None, seconds: float = 20.0) -> tuple[Verdict, World]:
    collecting = gc.isenabled()
    gc.disable()  # a schedule makes no cyclic garbage (`World._tear_down`): the collector's passes would only walk it
    try:
        world = World(seed, seconds=seconds, variant=variant).run()
        found = findings(world)
    finally:
        if collecting:
            # What the schedule made goes by refcount; enabled over it as it stands, the collector's next pass would
            # walk every object of it still alive (a young pass over the whole schedule: 5.6 ms of CPU of each). Moved
            # to the oldest generation unwalked (frozen, then thawed there), it waits for a full pass, which is seldom.
            gc.freeze()
            gc.unfreeze()
            gc.enable()
    acknowledged = sum(1 for op in world.ops if op.acknowledged)
    return Verdict(seed, seconds, world.faults.name, found, len(world.ops), acknowledged), world

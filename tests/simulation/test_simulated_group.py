"""The replica group's rules under the deterministic simulator: fixed schedules, fresh ones, and the bad rules caught.

Each schedule runs three replicas of the real `ReplicaCore` for 20 virtual
seconds under faults drawn from its seed, with five clients (busy around
each fault, slow between), then judges the history (`check`): the fixed
ones cover every kind of fault. A failure names the seed and the one
command that replays it step by step.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from faults.build import build

from . import Verdict, run
from .check import linearizable
from .variants import VARIANTS
from .world import FAULTS

FIXED = range(1, 201)
"""The schedules every run checks (and that each bad variant must fail among)."""
FRESH_SECONDS = 20.0
"""How long a run spends on schedules drawn fresh (their seeds printed), after the fixed ones."""


def said(verdict: Verdict, variant: str | None = None) -> str:
    lines = [f"seed {verdict.seed} ({verdict.faults}) broke: {', '.join(verdict.findings)}"]
    for name, found in verdict.findings.items():
        lines += [f"  {name}: {line}" for line in found[:3]]
    lines.append(f"replay: {verdict.replay(variant)}")
    return "\n".join(lines)


def test_every_fixed_schedule_keeps_every_promise() -> None:
    verdicts = [run(seed)[0] for seed in FIXED]
    combinations = {verdict.faults for verdict in verdicts}
    print(f"{len(verdicts)} fixed schedules, {len(combinations)} distinct fault combinations")
    failed = [said(verdict) for verdict in verdicts if not verdict.ok]
    assert failed == [], "\n".join(failed)
    drawn = {part for combination in combinations for part in combination.split("+")}
    assert drawn >= {*FAULTS, "rotation", "wrong-key", "unkeyed"}, "a kind of fault no fixed schedule draws"


def test_fresh_schedules_keep_every_promise() -> None:
    """Seeds no run has tried before (printed, so a failure is replayed with its seed)."""
    first = int(os.environ.get("SIMULATION_SEED", random.SystemRandom().randrange(10**6, 10**9)))
    print(f"fresh schedules from seed {first}")
    deadline, seed, failed, combinations = time.monotonic() + FRESH_SECONDS, first, [], set()
    while time.monotonic() < deadline:
        verdict, _ = run(seed)
        combinations.add(verdict.faults)
        if not verdict.ok:
            failed.append(said(verdict))
        seed += 1
    print(f"{seed - first} fresh schedules, {len(combinations)} distinct fault combinations")
    assert seed > first, "no fresh schedule ran"
    assert failed == [], "\n".join(failed)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_known_bad_rule_fails_the_fixed_schedules(variant: str) -> None:
    """Each bad variant breaks a promise in at least one of the schedules every run checks."""
    caught = next((verdict for seed in FIXED if not (verdict := run(seed, variant=variant)[0]).ok), None)
    assert caught is not None, f"{variant} kept every promise in seeds {FIXED.start}..{FIXED.stop - 1}"


def test_a_seed_replays_the_same_schedule_step_by_step() -> None:
    first, second = run(4)[1], run(4)[1]
    assert first.trace == second.trace and len(first.trace) > 2
    assert [(op.call, op.status, op.version) for op in first.ops] == [
        (op.call, op.status, op.version) for op in second.ops
    ]


def test_porcupine_finds_the_histories_linearizable_and_the_stale_reads_of_a_bad_rule_illegal(tmp_path: Path) -> None:
    """The fault suite's linearizability checker (`lincheck`, porcupine) over whole simulated histories."""
    lincheck = build().lincheck
    for seed in range(1, 11):
        verdict, world = run(seed)
        assert linearizable(world, lincheck, tmp_path)["verdict"] == "ok", said(verdict)
    broken, world = run(14, variant="no-confirm")
    assert not broken.ok and linearizable(world, lincheck, tmp_path)["verdict"] == "illegal"

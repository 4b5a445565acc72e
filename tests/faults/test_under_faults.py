"""The replicated store and registry under faults, checked: the short run (about two and a half minutes).

Each test is one run of `faults.rig` on the run's Apache Pulsar, a fresh
tenant, two `toolreg up --store pulsar` replicas behind Toxiproxy, a seeded
schedule, a recorded history checked by porcupine and the property checks.
The long run (`python -m bench --only faults`) cycles every schedule with
many seeds. A failing run leaves its history, logs and verdict under the
test's tmp_path; its summary names the seed that reproduces it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from faults.build import Binaries, build
from faults.rig import Run, run
from faults.schedules import sequence

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(300)]


@pytest.fixture(scope="session")
def binaries() -> Binaries:
    return build()


async def test_an_active_frozen_then_cut_off_by_a_stalled_link_passes_every_check_with_clocks_apart(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path, binaries: Binaries
) -> None:
    """SIGSTOP for 4-7 s, then a link that holds everything for 5-8 s and delivers it at once, the replicas' wall
    clocks 4 s apart: each time a standby fences the silent active, and the deposed one, back, answers nothing from
    its old state (it confirms its lock first, and cannot)."""
    setup = Run(apache_pulsar, tenant, tmp_path, binaries, "freeze-active, stall-active", seed=2, skew=True)
    verdict = await run(setup, sequence("freeze-active", "stall-active"))
    assert verdict.ok, verdict.summary()
    assert verdict.figures["terms"] >= 3 and verdict.figures["by_outcome"]["read_ok"] > 100, verdict.figures


async def test_a_deposed_active_that_answers_reads_without_checking_is_caught(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path, binaries: Binaries
) -> None:
    """The broken variant (`unsafe.py`): reads answered unconfirmed, no sign of a newer active heeded. Its link holds
    everything for 5-8 s, a standby takes over, and once the link lets requests through again it answers reads from
    its old state."""
    setup = Run(apache_pulsar, tenant, tmp_path, binaries, "stall-active (unsafe)", seed=3, unsafe=True)
    verdict = await run(setup, sequence("stall-active"))
    assert verdict.linearizable["verdict"] == "illegal", verdict.summary()


async def test_an_active_that_can_send_but_not_hear_loses_no_lease_and_stays_linearizable(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path, binaries: Binaries
) -> None:
    """Its statuses stop once a send waits for a receipt that never comes: a standby fences it within its takeover.
    Its registry hears nothing (its own status does not come back), so it expires no lease; its first write after
    that cannot confirm the lock, so it acknowledges none and steps down."""
    setup = Run(apache_pulsar, tenant, tmp_path, binaries, "partition-active-inbound", seed=2)
    verdict = await run(setup, sequence("partition-active-inbound"))
    assert verdict.ok, verdict.summary()

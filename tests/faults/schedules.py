"""What breaks, when, for how long: schedules of faults, each drawn from the run's seed.

Targets are found when a step starts (the active replica then, a standby
then), durations are drawn from `rig.rng`: the same seed, the same choices.
A step heals what it broke before the next one starts; `rig.heal()` after
the schedule heals anything left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .rig import Rig, Schedule
from .toxiproxy import Direction

RECOVER = 6.0
"""Seconds between two faults of a schedule: the group elects and serves again in about 4 (takeover after 3)."""


async def _hold(rig: Rig, low: float, high: float) -> None:
    await asyncio.sleep(rig.rng.uniform(low, high))


async def partition_active(rig: Rig, kind: str = "drop", direction: Direction = "both") -> None:
    """The active replica cut off from the broker (and so from every client, which reach it only through the broker)."""
    link = rig.link(rig.active())
    link.stall(direction) if kind == "stall" else link.drop(direction)
    await _hold(rig, 5, 8)
    link.heal()
    await asyncio.sleep(RECOVER)


async def partition_standby(rig: Rig) -> None:
    link = rig.link(rig.standby())
    link.drop()
    await _hold(rig, 5, 10)
    link.heal()
    await asyncio.sleep(RECOVER)


async def flapping(rig: Rig, seconds: float = 15.0) -> None:
    """The active's link down and up again every fraction of a second to a second and a half."""
    link = rig.link(rig.active())
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while loop.time() < until:
        link.drop()
        await _hold(rig, 0.3, 1.5)
        link.heal()
        await _hold(rig, 0.3, 1.5)
    await asyncio.sleep(RECOVER)


async def latency_active(rig: Rig, seconds: float = 15.0) -> None:
    """200 ms (±20) each way between the active replica and the broker."""
    link = rig.link(rig.active())
    link.delay(200, 20)
    await asyncio.sleep(seconds)
    link.heal()
    await asyncio.sleep(RECOVER / 2)


async def throttle_active(rig: Rig, seconds: float = 10.0) -> None:
    link = rig.link(rig.active())
    link.throttle(16)
    await asyncio.sleep(seconds)
    link.heal()
    await asyncio.sleep(RECOVER / 2)


async def cut_active(rig: Rig, times: int = 3) -> None:
    """Every connection of the active replica closed at once, a few times."""
    for _ in range(times):
        rig.link(rig.active()).cut()
        await asyncio.sleep(RECOVER / 2)


async def freeze_active(rig: Rig) -> None:
    """SIGSTOP for 4-7 s (past the takeover), then SIGCONT: a deposed active wakes with requests in its sockets."""
    name = rig.active()
    rig.freeze(name)
    await _hold(rig, 4, 7)
    rig.thaw(name)
    await asyncio.sleep(RECOVER)


async def freeze_standby(rig: Rig) -> None:
    """SIGSTOP of a standby for 4-7 s (past the takeover), then SIGCONT: it wakes with the active's statuses queued and
    must not take their silence for the active's."""
    name = rig.standby()
    rig.freeze(name)
    await _hold(rig, 4, 7)
    rig.thaw(name)
    await asyncio.sleep(RECOVER)


async def kill_active(rig: Rig) -> None:
    name = rig.active()
    rig.kill(name)
    await _hold(rig, 2, 4)
    await rig.restart(name)
    await asyncio.sleep(RECOVER / 2)


async def broker_restart(rig: Rig) -> None:
    """The broker stopped and started again (same ports, same data) while the clients write, batches among them."""
    await rig.restart_broker()
    await asyncio.sleep(RECOVER)


Step = Callable[[Rig], Awaitable[None]]

STEPS: dict[str, Step] = {
    "partition-active": partition_active,
    "stall-active": lambda rig: partition_active(rig, "stall"),
    "partition-active-outbound": lambda rig: partition_active(rig, "drop", "up"),
    "partition-active-inbound": lambda rig: partition_active(rig, "drop", "down"),
    "partition-standby": partition_standby,
    "flapping": flapping,
    "latency-active": latency_active,
    "throttle-active": throttle_active,
    "cut-active": cut_active,
    "freeze-active": freeze_active,
    "freeze-standby": freeze_standby,
    "kill-active": kill_active,
    "broker-restart": broker_restart,
}
"""Every single fault a schedule is made of."""


def repeated(step: Step, times: int) -> Schedule:
    async def schedule(rig: Rig) -> None:
        for _ in range(times):
            await step(rig)

    return schedule


def combined(steps: int, choices: list[str] | None = None) -> Schedule:
    """`steps` faults drawn (with the seed) from `choices` (every one but the broker's restart by default)."""

    async def schedule(rig: Rig) -> None:
        names = choices or [name for name in STEPS if name != "broker-restart"]
        for _ in range(steps):
            await STEPS[rig.rng.choice(names)](rig)

    return schedule


def sequence(*names: str) -> Schedule:
    async def schedule(rig: Rig) -> None:
        for name in names:
            await STEPS[name](rig)

    return schedule


SCHEDULES: dict[str, Schedule] = {
    **{name: repeated(step, 2) for name, step in STEPS.items() if name != "broker-restart"},
    "broker-restart": repeated(broker_restart, 1),
    "combined": combined(5),
}
"""What the long run cycles through (`python -m bench --only faults`), each with seeds of its own."""

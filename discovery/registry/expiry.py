"""Lease expiry: the sweep that drops instances whose ttl ran out, and the policy around it.

`leases` knows when a lease runs out and when a sweep must hold its
deletions (self-preservation: a large share of leases stopping at once says
more of the registry or the broker than of the services). This module
decides when a sweep may run at all: not right after the process itself did
not run (`_stalled`: a SIGSTOP, a paused VM), and not while the registry
cannot hear the broker (`_deaf`), since a silence it could not hear says
nothing of the services. What runs out is marked for the writer, and logged.

A connection's state does not say whether anything still comes in: one that
loses what the broker sends, or hangs, stays "connected" until a keep-alive
fails, half a minute later. A registry in a replica group has the proof
(`hearing`): its replica's own status comes back from the broker every
second, and every announcement or heartbeat that comes in proves it too
(`inbound`). A sweep then runs as of the moment it last heard, never later,
and not at all once it has heard nothing for `DEAF_AFTER`.

Sweeps keep to the ticks of `sweep_interval`, but a tick at which nothing
can run out is skipped (`due_at`: the next lease's end, the next kept name's
release): the registry (`Registry`) sleeps until the first tick that can find
something to do, or the next look at its topics (every second), whichever
comes first. A lease still runs out at the same tick as if every tick swept;
what an idle tick would only have noticed (a stall, the broker lost or heard
again) is noticed within a second, and every tick sweeps while sweeps are
paused or the broker is not heard.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import TypeAlias

from toolservice_base.logs import get_logger

from .departed import Departed
from .leases import Lease, LeaseTable, ServiceKey
from .metrics import RegistryMetrics
from .options import RegistryOptions
from .probes import Prober
from .writer import StoreWriter

__all__ = ["DEAF_AFTER", "STALL", "STALL_PAUSE", "Expiry", "Hearing"]

log = get_logger("discovery.registry")

STALL = 3.0
"""A gap this long between two lease sweeps (or four of their intervals, if longer): the process did not run. Well above
what a busy loop takes between two sweeps, so a loaded machine never turns expiry off."""
STALL_PAUSE = 5.0
"""Seconds no lease expires after such a gap: longer than heartbeats take to come in again (one every ttl/3), and than a
deposed replica takes to learn it was replaced meanwhile (a newer term heard within a second, its lock seen lost within
two)."""
DEAF_AFTER = 2.5
"""Seconds without the replica's own status coming back (it goes out every second) that make the registry deaf."""

Hearing: TypeAlias = Callable[[], float | None]
"""When (monotonic) the broker last delivered this process's own message back to it (None: not yet)."""


class Expiry:
    """The periodic lease sweep (`sweep`, at the ticks of `RegistryOptions.sweep_interval` that `due_at` asks for),
    paused while expiry would lie."""

    def __init__(
        self,
        *,
        leases: LeaseTable,
        writer: StoreWriter,
        prober: Prober,
        options: RegistryOptions,
        metrics: RegistryMetrics,
        departed: Departed,
        report_state: Callable[[], None],
        hearing: Hearing | None = None,
        inbound: Hearing | None = None,
    ) -> None:
        self.leases = leases
        self._writer = writer
        self._prober = prober
        self.options = options
        self.metrics = metrics
        self.departed = departed
        self._report_state = report_state
        self.hearing = hearing
        """When this process last heard the broker deliver its own message (`Hearing`); None: the connection decides."""
        self.inbound = inbound
        """When the last announcement or heartbeat came in (`Hearing`): as good a proof of hearing as its own status."""
        self._last_sweep = time.monotonic()
        self._sweeps_paused_until = 0.0
        self._disconnected = False

    def due_at(self, now: float) -> float:
        """When (monotonic) a sweep can next find something to do: a lease running out, or a kept name released; `now`
        (every tick) while sweeps are paused or the broker is not heard. At or before `now`: at the next tick."""
        if self._disconnected or now < self._sweeps_paused_until:
            return now
        kept = self.departed.next_due
        released = now + (kept - time.time()) if kept != float("inf") else kept
        return min(self.leases.next_due(), released)

    def _mark(self, key: ServiceKey) -> None:
        self._writer.mark(key)

    def _recheck_conflicts(self, workspaces: list[str] | set[str]) -> None:
        self._writer.recheck_conflicts(workspaces)

    def _stalled(self, now: float) -> bool:
        """Whether this process has just come back from not running (SIGSTOP, a paused VM): then no lease expires for a
        while.

        A registry that did not run heard no heartbeat meanwhile; the silence
        is its own, not the services'. Sweeps stay off for `STALL_PAUSE`, long
        enough for the heartbeats to come in again (and, for a replica, to
        learn that another one took over meanwhile).
        """
        gap, self._last_sweep = now - self._last_sweep, now
        if gap > max(STALL, 4 * self.options.sweep_interval):
            log.warning(
                "registry.sweeps_paused",
                stalled_s=round(gap, 1),
                paused_s=STALL_PAUSE,
                note="this process did not run for a while: no lease expires on silence it could not hear",
            )
            self._sweeps_paused_until = now + STALL_PAUSE
        return now < self._sweeps_paused_until

    async def _deaf(self, now: float) -> bool:
        """Whether the registry cannot hear the broker now, or could not less than `STALL_PAUSE` ago: then no lease
        expires.

        During a broker outage no heartbeat can arrive, and the registry's
        deletions could not be written anyway: expiring then would only
        remove every tool when the broker comes back and add it again a
        heartbeat later, a flap every agent sees. Once back, every service
        is asked to announce at once, so the leases renew within the pause.
        """
        reason = self._cut_off(now)
        if reason is not None:
            if not self._disconnected:
                self._disconnected = True
                log.warning(
                    "registry.sweeps_paused", reason=reason, note="no lease expires while no heartbeat can be heard"
                )
            self._sweeps_paused_until = now + STALL_PAUSE
            return True
        if self._disconnected:
            self._disconnected = False
            log.info("registry.reconnected", paused_s=STALL_PAUSE, note="every service is asked to announce again")
            await self._prober.probe(None, "the registry reconnected to the broker")
        return now < self._sweeps_paused_until

    def _cut_off(self, now: float) -> str | None:
        """Why the registry cannot hear the broker now; None if it can."""
        if not self._prober.connected:
            return "not connected to the broker"
        heard = self._heard_until(now)
        if now - heard > DEAF_AFTER:
            return f"its replica's own status, sent every second, has not come back from the broker for {DEAF_AFTER:g}s"
        return None

    def _heard_until(self, now: float) -> float:
        """The last moment the registry is known to have heard the broker: `now` unless a `hearing` says otherwise (a
        status not yet back, just after start, says nothing: the connection's state decides then)."""
        heard = self.hearing() if self.hearing is not None else None
        if heard is None:
            return now
        inbound = self.inbound() if self.inbound is not None else None
        return min(now, heard if inbound is None else max(heard, inbound))

    async def sweep(self) -> None:
        self._recheck_conflicts(self.departed.prune(time.time()))  # a kept name is free now
        now = time.monotonic()
        if self._stalled(now) or await self._deaf(now):
            return
        result = self.leases.sweep(self._heard_until(now))  # a lease runs out only on a silence the registry heard
        if (
            not result.expired and not result.held
        ):  # the usual sweep: nothing ran out, so only the instance count may have moved
            self.metrics.instances.set(len(self.leases))
            return
        gone: dict[ServiceKey, list[Lease]] = defaultdict(list)
        for lease in result.expired:
            gone[lease.service].append(lease)
        self.metrics.expired(len(result.expired))
        self._report_state()
        for key, leases in gone.items():
            self._mark(key)
            event = "instance.expired" if self.leases.has_service(key) else "service.expired"
            refused = next((lease.refused for lease in leases if lease.refused), None)
            log.info(
                event,
                service=key.service,
                workspace=key.workspace,
                instances=[lease.instance for lease in leases],
                ttl=leases[0].ttl,
                refused=refused,
            )
        if result.held:
            services = sorted({lease.service.service for lease in result.held})
            if len(result.held) < len(self.leases.held()):  # already holding: say it once, loudly
                log.info(
                    "registry.self_preservation_extended", held=services, reason="more leases ran out while holding"
                )
                return
            log.warning(
                "registry.self_preservation",
                reason=(
                    f"{result.failing} of {result.total} leases stopped renewing at once ({result.share:.0%} >"
                    f" {self.options.self_preservation_share:.0%}): suspecting the registry or the broker, not the"
                    " services"
                ),
                held=services,
                action=(
                    "their tools stay listed as 'held'; they are released when heartbeats resume, or run `toolreg"
                    " release` to delete them"
                ),
            )

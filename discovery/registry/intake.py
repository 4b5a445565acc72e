"""The registry's intake: every message on `tool-descriptors`, judged, then turned into leases and dirty services.

Nothing here writes to the store: an announce, heartbeat or withdraw only
changes memory (`leases`, the services' offers) and marks services for the
writer (`writer`). What is refused is logged, kept in the rejection log and,
where it helps, told to its sender (`probes`).

A refused message still says something: its sender is alive. A lease whose
holder keeps sending refused messages is marked so (`leases`), and runs out
without self-preservation holding it. Without a trust policy an instance is
bound to the workspace and service of its lease: an unverified message
naming it elsewhere is refused before it can touch the instance's sequence
memory. A replay refusal is told to the instance too: if another sender took
its identity over, its announcer starts again under a fresh id
(`toolservice_base.announcer`).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from opentelemetry.trace import SpanContext

from toolservice_base import tracing
from toolservice_base.announcer import bound_refusal
from toolservice_base.call_stats import TOOL_STATS
from toolservice_base.logs import get_logger
from toolservice_base.schemas import Announcement
from toolservice_base.signing import public_key_text, signature_key_id
from toolservice_base.transport import Envelope

from .book import ServiceBook
from .departed import Departed
from .leases import Lease, LeaseTable, ServiceKey
from .merge import Offer
from .metrics import RegistryMetrics
from .options import RegistryOptions
from .pins import PinBook
from .probes import Prober
from .refusals import Refusals
from .state import ServiceState
from .usage import InstanceCalls
from .usage import sample as usage_sample
from .validation import (
    FRESHNESS,
    TAKEOVER,
    AnnouncementValidator,
    Rejected,
)
from .writer import StoreWriter

__all__ = ["Intake"]

log = get_logger("discovery.registry")


class Intake:
    """Judges each announcement and applies it to the registry's memory: the services (`ServiceBook`) and the leases;
    what it refuses goes to `Refusals`."""

    def __init__(
        self,
        *,
        book: ServiceBook,
        leases: LeaseTable,
        writer: StoreWriter,
        prober: Prober,
        options: RegistryOptions,
        metrics: RegistryMetrics,
        validator: AnnouncementValidator,
        refusals: Refusals,
        departed: Departed,
        pins: PinBook | None,
    ) -> None:
        self._book = book
        self.leases = leases
        self._writer = writer
        self._prober = prober
        self.options = options
        self.metrics = metrics
        self.validator = validator
        self.refusals = refusals
        self.departed = departed
        self.pins = pins
        self._announces = itertools.count(1)

    def _mark(self, key: ServiceKey, *, force: bool = False, link: SpanContext | None = None) -> None:
        self._writer.mark(key, force=force, link=link)

    async def on_message(self, message: Envelope) -> None:
        data = message.data
        wall, now = time.time(), time.monotonic()
        self._book.heard(now)
        try:
            announcement = self.validator.check(data, wall, self._authorize)
            if announcement.kind == "announce" and (refusal := self._over_capacity(announcement)) is not None:
                service = announcement.service.id if announcement.service else None
                raise Rejected(
                    refusal,
                    instance=announcement.instance,
                    service=service,
                    category="capacity",
                    announcement=announcement,
                )
            if (
                announcement.kind == "announce"
                and self.pins is not None
                and (refusal := self.pins.refusal(announcement)) is not None
            ):
                service = announcement.service.id if announcement.service else None
                raise Rejected(
                    refusal,
                    instance=announcement.instance,
                    service=service,
                    category="definition",
                    announcement=announcement,
                )
        except Rejected as exc:
            await self._refused(exc, data, wall)
            return
        self.metrics.announcement(announcement.kind)
        if announcement.kind == "announce":
            await self._on_announce(announcement, now, wall, tracing.remote_context(message.properties))
        elif announcement.kind == "heartbeat":
            probe = self._on_heartbeat(announcement, now, wall, message.properties.get(TOOL_STATS))
            if probe is not None:
                await self._prober.probe(announcement.instance, probe)
        else:
            self._on_withdraw(announcement, wall, tracing.remote_context(message.properties))

    async def _refused(self, exc: Rejected, data: bytes, wall: float) -> None:
        """Record a refusal, tell its sender (once per entry of the log; a replay or identity refusal each
        time, rate-limited, for the instance may be locked out), and mark the lease it names as refused.

        A lease counts as refused only if the message can be its holder's:
        not a freshness refusal (a replay, or a clock out of step, says
        nothing about the holder), and, for a lease its holder signed under
        the trust policy, signed by the same key; an unsigned lease cannot
        tell its holder from anyone else, so any refusal naming it counts.
        """
        new = self.refusals.reject(
            exc.reason,
            data,
            wall,
            instance=exc.instance,
            service=exc.service,
            workspace=exc.workspace,
            category=exc.category,
        )
        if exc.instance is None:
            return
        if exc.category in TAKEOVER:
            # A replay, or an instance named for another workspace or service: the refused message may be
            # its real holder's, locked out because another sender took its id over (nothing tells them
            # apart without a signature). Tell the instance each time (notices are rate-limited per
            # instance; only instances the registry remembers are ever refused so): its announcer starts
            # again under a fresh id if the notice shows a takeover, and ignores it if not.
            await self._prober.notify(exc.instance, exc.reason)
            return
        lease = self.leases.get(exc.instance)
        holder = (
            exc.category not in FRESHNESS
            and lease is not None
            and (
                lease.signer is None
                or (
                    exc.announcement is not None
                    and self.options.trust is not None
                    and self.options.trust.signed_by(exc.announcement, lease.signer)
                )
            )
        )
        if holder and lease is not None and lease.refused is None:
            self.leases.refuse(exc.instance, exc.reason)
            log.warning(
                "instance.refused",
                service=lease.service.service,
                workspace=lease.service.workspace,
                instance=exc.instance,
                reason=exc.reason,
                note="its holder is sending but refused: removed when its lease runs out, never held",
            )
        # Tell the sender, once per entry of the log: the holder of a lease, or a new instance whose
        # announce was refused. Not an unknown instance's heartbeat: outsiders must not spend notices.
        newcomer = lease is None and exc.announcement is not None and exc.announcement.kind == "announce"
        if new and (holder or (newcomer and exc.category not in FRESHNESS)):
            await self._prober.notify(exc.instance, exc.reason)

    def _authorize(self, announcement: Announcement) -> str | None:
        """May this message speak for its instance? None if so, else why not (or `Rejected`, category `identity`).

        Runs before the validator records the message's sequence, so nothing
        refused here touches the instance's replay state.

        Without a trust policy no signature can be verified, so an instance
        is bound to the workspace and service it holds a lease for: a message
        naming it for another one is refused (`identity`), whatever its
        sequence. Else one forged message could move a live instance away
        and, with a huge sequence, lock its real holder out.

        With a trust policy: an announce must be allowed its service, tools
        and workspace, and, if its instance holds a lease for another service
        or workspace, that one too: else a key trusted for one service could
        move another's instances away and so remove its tools. A heartbeat or
        withdraw is judged against the service and workspace its instance
        announced; one from an unknown instance changes nothing but still
        needs a trusted signature, so outsiders cannot spend probes or
        sequence memory.
        """
        trust = self.options.trust
        lease = self.leases.get(announcement.instance)
        if trust is None:
            if lease is not None:
                self._check_binding(announcement, lease)
            return None
        if announcement.kind == "announce":
            assert announcement.service is not None and announcement.tools is not None
            refusal = trust.check(
                announcement,
                announcement.service.id,
                [tool.name for tool in announcement.tools],
                announcement.workspace,
            )
            if (
                refusal is None
                and lease is not None
                and lease.service != ServiceKey(announcement.workspace, announcement.service.id)
            ):
                moved = trust.check(announcement, lease.service.service, [], lease.service.workspace)
                if moved is not None:
                    return (
                        f"instance {announcement.instance} serves {lease.service.service!r} in workspace"
                        f" {lease.service.workspace!r}: {moved}"
                    )
            return refusal
        if lease is None:
            return trust.check(announcement, None, [])
        return trust.check(announcement, lease.service.service, [], lease.service.workspace)

    @staticmethod
    def _check_binding(announcement: Announcement, lease: Lease) -> None:
        """`Rejected` (`identity`) if an unverified message names `lease`'s instance for another workspace or
        service."""
        workspace, service = lease.service
        claimed = announcement.service.id if announcement.service is not None else service
        if (announcement.workspace, claimed) != (workspace, service):
            reason = bound_refusal(announcement.instance, service, workspace, claimed, announcement.workspace)
            raise Rejected(
                reason, instance=announcement.instance, service=claimed, category="identity", announcement=announcement
            )

    def _over_capacity(self, announcement: Announcement) -> str | None:
        """Why a new instance cannot get a lease (the caps on per-instance state), or None.

        `state.since` holds every instance of a service that announced since
        the last merge, so it is an upper bound of its instances, at O(1).
        """
        assert announcement.service is not None
        key = ServiceKey(announcement.workspace, announcement.service.id)
        lease = self.leases.get(announcement.instance)
        if lease is not None and lease.service == key:
            return None  # a renewal: no new state
        opts = self.options
        state = self._book.get(key)
        if state is not None and len(state.since) >= opts.max_instances_per_service:
            return (
                f"capacity: service {key.service!r} already has {len(state.since)} instances, "
                f"the limit per service is {opts.max_instances_per_service}"
            )
        if len(self.leases) >= opts.max_instances:
            return f"capacity: the registry holds {len(self.leases)} instance leases, the limit is {opts.max_instances}"
        return None

    async def _on_announce(
        self, announcement: Announcement, now: float, wall: float, link: SpanContext | None = None
    ) -> None:
        assert announcement.service is not None and announcement.tools is not None  # the model guarantees it
        key = ServiceKey(announcement.workspace, announcement.service.id)
        state = self._book.admit(key)
        known = announcement.digest in state.offers
        signer = signature_key_id(announcement) if self.options.trust is not None else None
        trusted = self.options.trust.keys.get(signer) if self.options.trust is not None and signer else None
        state.offers[announcement.digest] = Offer(
            announcement.service,
            tuple(announcement.tools),
            announcement.digest,
            announcement.version,
            signer,
            None if trusted is None else public_key_text(trusted.public_key),
        )
        if len(state.offers) > 2 * self.options.max_instances_per_service:
            self._forget_unused_offers(state, keep=announcement.digest)
        previous = self.leases.get(announcement.instance)
        lease, created = self.leases.renew(
            announcement.instance,
            key,
            ttl=announcement.ttl,
            now=now,
            wall=wall,
            digest=announcement.digest,
            announced=next(self._announces),
            **self._provenance(announcement),
        )
        state.since.setdefault(announcement.instance, wall)
        if created:  # the gauge moves now, not at the next sweep (sweeps skip the ticks where nothing runs out)
            self.metrics.instances.set(len(self.leases))
        if previous is not None and previous.service != key:
            self._mark(previous.service)  # the instance now serves another service id
        if previous is not None and previous.held:
            self._resume(now)
        # An offer seen for the first time (after a restart, say) is checked against
        # the store even if the record says nothing changed: conflicts live in memory.
        self._mark(key, force=not known, link=link)

    def _on_heartbeat(
        self, announcement: Announcement, now: float, wall: float, stats: str | None = None
    ) -> str | None:
        """Renew the lease; `stats`, the heartbeat's `tool-stats` property, goes on it for the page (`usage`). Returns
        why its instance is to be probed, if it is (a plain function: a heartbeat costs no coroutine of its own)."""
        lease = self.leases.get(announcement.instance)
        if lease is None or lease.service.workspace != announcement.workspace:
            return "heartbeat from an unknown instance"
        was_held = lease.held
        self.leases.renew(
            announcement.instance,
            lease.service,
            ttl=announcement.ttl,
            now=now,
            wall=wall,
            **self._provenance(announcement),
        )
        if was_held:
            self._resume(now)
        state = self._book.get(lease.service)
        if lease.digest != announcement.digest:
            return "heartbeat with an unknown digest"
        if state is None or lease.digest not in state.offers:
            return "descriptors not known since the registry started"
        if stats is not None:
            self._heard_calls(lease, announcement, stats, {tool.name for tool in state.offers[lease.digest].tools})
        return None

    @staticmethod
    def _heard_calls(lease: Lease, announcement: Announcement, stats: str, tools: set[str]) -> None:
        """Keep a heartbeat's call counters on its lease, for the tools its instance offers. Unsigned and
        informational: a malformed property is ignored (at debug), never a reason to refuse the heartbeat."""
        try:
            heard = usage_sample(stats, announcement.sent_at, tools)
        except ValueError as exc:
            log.debug(
                "heartbeat.stats_ignored", instance=lease.instance, service=lease.service.service, reason=str(exc)
            )
            return
        if lease.calls is None:
            lease.calls = InstanceCalls()
        lease.calls.add(heard)

    def _provenance(self, announcement: Announcement) -> dict[str, Any]:
        """What a lease keeps of the message that renewed it: its sequence and, under a trust policy, its signer."""
        signer = signature_key_id(announcement) if self.options.trust is not None else None
        return {"sequence": announcement.sequence, "signer": signer}

    def _forget_unused_offers(self, state: ServiceState, keep: str) -> None:
        """Drop offers no instance holds: an instance cycling digests must not grow them between merges."""
        in_use = {lease.digest for lease in self.leases.of_service(state.key)} | {keep}
        for digest in [digest for digest in state.offers if digest not in in_use]:
            del state.offers[digest]

    def _on_withdraw(self, announcement: Announcement, wall: float, link: SpanContext | None = None) -> None:
        """Drop the lease, and refuse the instance from now on: a captured message of it is a replay.

        It is refused until its messages are stale anyway: one skew (a
        sender's clock may be that far ahead) plus the window a message is
        fresh in (its ttl, never more than one skew).
        """
        lease = self.leases.remove(announcement.instance)
        if lease is None:
            return
        until = wall + 2 * self.options.max_clock_skew
        self.validator.ended(announcement.instance, announcement.sequence, until)
        self.departed.withdrawn(announcement.instance, lease.service, announcement.sequence, until)
        log.info(
            "instance.withdrawn",
            service=lease.service.service,
            workspace=lease.service.workspace,
            instance=lease.instance,
        )
        self._mark(lease.service, link=link)

    def _resume(self, now: float) -> None:
        resumed = self.leases.resume_held(now)
        if resumed:
            log.warning(
                "registry.self_preservation_ended",
                reason="heartbeats resumed",
                leases=len(resumed),
                note="held instances not heard from expire normally after one more ttl",
            )

"""The registry: announced tool services, merged into the config store while they live.

It consumes `tool-descriptors` on a subscription of its own, judges every
message (`validation`), keeps one lease per instance (`leases`), and merges
live services into the store under the keys an operator would write by hand
(`merge`), recording what it owns in `discovery/<service-id>`. One task (`writer`) does
every store write, batched on the leading edge (a lone change is written at
once, a burst becomes a few versions); the message handler and the sweep only
change memory and mark services dirty.

Start-up: ownership records are read back, every recorded instance gets one
ttl of grace, and a probe asks live services to re-announce. A service that
died while the registry was down simply never answers and expires after the
grace; one that lives keeps its tools without a single store write. A
registry elected from standby starts warm instead: each recorded lease ends
when what it heard as a standby says (`heard`), with no grace. What
the previous run kept of departures (`departed`: withdrawn instances, names
kept for a service that went) is read back too, so a restart opens no
window for a replayed message and hands no name over early.

A refused message still says something: its sender is alive. A lease whose
holder keeps sending refused messages is marked so (`leases`), and runs out
without self-preservation holding it; the sender is told why (`probes`).
Without a trust policy an instance is bound to the workspace and service of
its lease: an unverified message naming it elsewhere is refused before it
can touch the instance's sequence memory. A replay refusal is told to the
instance too: if another sender took its identity over, its announcer starts
again under a fresh id (`toolservice_base.announcer`).

Query API on `tool-registry`: `list`, `get`, `rejections`, `conflicts`,
`release`, and for pinned definitions (`pins`, `--pin-definitions`)
`pending`, `approve` and `reject`.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from contextlib import AsyncExitStack
from typing import Any, Self

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from opentelemetry.trace import SpanContext
from pydantic import ValidationError

from toolservice_base import tracing
from toolservice_base.announcer import bound_refusal
from toolservice_base.call_stats import TOOL_STATS
from toolservice_base.configclient import ConfigClient, watch_config
from toolservice_base.errors import (
    ConfigError,
    RegistryError,
    RequestTimeout,
)
from toolservice_base.logs import get_logger
from toolservice_base.rpc import RequestServer, error_body
from toolservice_base.schemas import (
    MAX_PAGE_ITEMS,
    MAX_QUERY_BYTES,
    Announcement,
    ConfigPush,
    ErrorBody,
    describe_validation_error,
)
from toolservice_base.signing import signature_key_id
from toolservice_base.transport import (
    Envelope,
    Subscription,
    Transport,
    unique_name,
)

from .departed import DEPARTED_KEY, Departed
from .heard import HeardLeases
from .leases import Lease, LeaseTable, ServiceKey
from .merge import RECORD_TYPE, Offer, OwnershipRecord
from .metrics import RegistryMetrics
from .options import RegistryOptions
from .overview import Overview, trust_view
from .paging import page_of
from .pins import PENDING_TYPE, PIN_TYPE, Pending, PinBook, PinError, rejected_reason
from .probes import ProbeLimiter, Prober
from .protocol import NameConflict, PendingChange, RegistryRequest, RegistryResponse, Rejection, ToolStatus
from .state import ServiceState, static_status
from .store_writes import PROBE_WORKSPACE
from .usage import InstanceCalls
from .usage import sample as usage_sample
from .validation import (
    FRESHNESS,
    SEQUENCE_MEMORY,
    TAKEOVER,
    AnnouncementValidator,
    Category,
    Rejected,
    RejectionLog,
    excerpt,
)
from .writer import StoreWriter

__all__ = ["ProbeLimiter", "Registry", "RegistryOptions"]

log = get_logger("discovery.registry")

STALL = 3.0
"""A gap this long between two lease sweeps (or four of their intervals, if longer): the process did not run. Well above
what a busy loop takes between two sweeps, so a loaded machine never turns expiry off."""
STALL_PAUSE = 5.0
"""Seconds no lease expires after such a gap: longer than heartbeats take to come in again (one every ttl/3), and than a
deposed replica takes to learn it was replaced meanwhile (a newer term heard within a second, its lock seen lost within
two)."""

TOPIC_CHECK = 1.0
"""Seconds between two looks at what the transport says of the registry's topics (`_report_topics`)."""

DESCRIPTOR_PERMITS = 10_000
"""Receiver queue on `tool-descriptors`. The topic is non-persistent: the broker drops what a consumer has
no permits for, so a burst beyond the queue is lost, not delayed. 1,000 (the default) dropped heartbeats
from 8,700/s up on 2 cores; 10,000 (~2 MB of heartbeats) absorbs a second of burst (`make bench`, throughput)."""


class Registry:
    """The registry service. `start()`, then it runs on the event loop until `stop()`."""

    def __init__(
        self,
        connection: Transport,
        *,
        workspace_default: str = "default",
        options: RegistryOptions | None = None,
        metrics: RegistryMetrics | None = None,
        heard: HeardLeases | None = None,
    ) -> None:
        """`heard`: what this process heard as a standby (`heard`); the recorded leases start from it, not from a ttl of
        grace."""
        self._connection = connection
        self._heard = heard
        self.workspace_default = workspace_default
        self.options = options or RegistryOptions()
        self.metrics = metrics or RegistryMetrics.default()
        opts = self.options
        self.leases = LeaseTable(threshold=opts.self_preservation_share, minimum=opts.self_preservation_min)
        self.validator = AnnouncementValidator(
            opts.allowed_namespaces or connection.topics.queue_namespaces,
            max_skew=opts.max_clock_skew,
            memory=max(SEQUENCE_MEMORY, 2 * opts.max_instances),
        )
        self.rejection_log = RejectionLog(opts.max_rejections)
        self.departed = Departed()
        self.pins = PinBook(opts.auto_approve) if opts.pin_definitions else None
        """Pinned definitions and held changes (`pins`); None without `--pin-definitions`."""
        self._services: dict[ServiceKey, ServiceState] = {}
        self._order = itertools.count(1)
        self._announces = itertools.count(1)
        self._config = ConfigClient(connection, workspace=workspace_default, timeout=opts.store_timeout)
        self.writer = StoreWriter(
            self._config,
            self._services,
            self.leases,
            workspace_default=workspace_default,
            max_retry_delay=opts.max_retry_delay,
            metrics=self.metrics,
            on_refused=lambda key, reason: self._reject(
                reason, b"", time.time(), service=key[1], workspace=key[0], category="store"
            ),
            on_merged=self._report_state,
            departed=self.departed,
            on_conflicts=self._tell_conflicts,
            pins=self.pins,
        )
        self._prober = Prober(connection, interval=opts.probe_interval, per_second=opts.max_probes_per_second)
        self.overview = Overview(
            services=self._services,
            leases=self.leases,
            config=self._config,
            rejections=self.rejection_log,
            conflicts=self.conflicts,
            key_names=self._key_names,
            workspace_default=workspace_default,
            pending=self.pending if self.pins is not None else None,
            trust=trust_view(opts.trust),
        )
        """What the registry page shows (`await registry.overview.snapshot()`), read-only."""
        self._descriptors: Subscription | None = None
        self._watch: Subscription | None = None
        self._server = RequestServer(
            connection,
            connection.topics.registry_request,
            connection.topics.registry_response,
            self._handle,
            subscription="tool-registry",
            too_large=lambda reason: error_body(
                "answer-too-large", f"{reason}; ask for `list` in pages (`limit`, `after`)"
            ),
        )
        self._scheduler: AsyncIOScheduler | None = None
        self._running = False
        self._resources = AsyncExitStack()
        self._last_sweep = time.monotonic()
        self._sweeps_paused_until = 0.0
        self._disconnected = False
        self._reported: dict[str, str] = {}
        """Topic -> the problem last logged for it (`_report_topics`)."""

    # --- life cycle ----------------------------------------------------------

    async def start(self) -> None:
        """Each step registers its undo as it succeeds: a failure half-way leaves nothing open."""
        connection, topics = self._connection, self._connection.topics
        async with AsyncExitStack() as stack:
            await self._config.start()
            stack.push_async_callback(self._config.close)
            try:
                await self.writer.writes.detect()
                await self._restore()
            except (RequestTimeout, ConfigError) as exc:
                raise RegistryError(f"the config store did not answer ({exc}); start it first (`toolreg up`)") from None
            await self._prober.start()
            stack.push_async_callback(self._prober.stop)
            self._descriptors = await connection.subscribe(
                topics.tool_descriptors,
                self._on_message,
                subscription=unique_name("tool-registry"),
                receiver_queue=DESCRIPTOR_PERMITS,
            )
            stack.push_async_callback(self._stop_intake)
            self._watch = await watch_config(connection, self._on_push)
            stack.push_async_callback(connection.unsubscribe, self._watch)
            await self._server.start()
            stack.push_async_callback(self._server.stop, 2.0)
            self.writer.start()
            stack.push_async_callback(self._finish_writes)
            scheduler = AsyncIOScheduler()
            scheduler.add_job(
                self._sweep,
                "interval",
                seconds=self.options.sweep_interval,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=None,
            )
            scheduler.add_job(
                self._report_topics,
                "interval",
                seconds=TOPIC_CHECK,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=None,
            )
            scheduler.start()
            self._scheduler = scheduler
            stack.callback(self._stop_sweeps)
            self._running = True
            await self._prober.probe(None, "registry started")
            self._resources = stack.pop_all()
        warm = None if self._heard is None else sum(1 for lease in self.leases if not lease.grace)
        log.info(
            "registry.started",
            services=len(self._services),
            leases=len(self.leases),
            warm=warm,
            workspaces=sorted(self.writer.indexed),
        )
        if self.options.trust is None:
            log.warning(
                "registry.untrusted", note="no trust policy: every valid announcement is accepted, signed or not"
            )
        else:
            log.info(
                "registry.trusted",
                keys=len(getattr(self.options.trust, "keys", ())),
                path=str(getattr(self.options.trust, "path", "")),
            )

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self, *, flush: bool = True) -> None:
        """Stop taking messages, finish pending writes (briefly), close. The store keeps what was merged.

        `flush=False` writes nothing more: for a replica that was deposed, whose
        pending writes come from a view that stopped while another registry
        was active (its leases ran out unheard while it was frozen).
        Safe at any point: before `start()`, after a failed one, twice.
        """
        was_running, self._running = self._running, False
        self._stop_sweeps()
        if not flush:
            await self.writer.stop()  # first: no pending write reaches the store from here on
        await self._stop_intake()
        await self._resources.aclose()
        if was_running:
            log.info("registry.stopped")

    def _stop_sweeps(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None

    async def _stop_intake(self) -> None:
        if self._descriptors is not None:
            descriptors, self._descriptors = self._descriptors, None
            await self._connection.unsubscribe(descriptors)

    async def _finish_writes(self) -> None:
        try:
            await self.writer.settle(timeout=2.0)
        except TimeoutError:
            log.warning("registry.stop_unflushed", services=self.writer.pending)
        await self.writer.stop()

    async def settle(self, timeout: float = 5.0) -> None:
        """Wait until every pending change has been written (for tests and shutdown)."""
        await self.writer.settle(timeout)

    @property
    def store_writes(self) -> int:
        """Transactions this registry sent to the store (tests use it to prove coalescing)."""
        return self.writer.store_writes

    async def _restore(self) -> None:
        """Read ownership records back and give every recorded instance one ttl of grace (or what a standby heard); read
        back `departed`."""
        await self.writer.read_index()
        now, wall = time.monotonic(), time.time()
        found = await self._config.get([DEPARTED_KEY], workspace=PROBE_WORKSPACE)
        try:
            self.departed.load(found.get(DEPARTED_KEY), wall)
        except ValueError as exc:
            log.warning(
                "registry.record_unreadable",
                key=f"{DEPARTED_KEY[0]}/{DEPARTED_KEY[1]}",
                workspace=PROBE_WORKSPACE,
                reason=str(exc),
            )
        for instance, withdrawn in self.departed.instances.items():
            self.validator.ended(instance, withdrawn.sequence, withdrawn.until)
        if self.pins is not None:
            await self._restore_pins()
        for workspace in sorted(self.writer.indexed):
            records = await self._config.getvalues(RECORD_TYPE, workspace=workspace)
            for service_id, value in sorted(records.items()):
                try:
                    record = OwnershipRecord.from_value(value)
                    owned = record.owned_keys()
                except ValueError as exc:
                    log.warning(
                        "registry.record_unreadable",
                        key=f"{RECORD_TYPE}/{service_id}",
                        workspace=workspace,
                        reason=str(exc).splitlines()[0],
                    )
                    continue
                key = (workspace, service_id)
                state = ServiceState(key, next(self._order), record=record, owned=owned)
                state.since = {instance: item.since for instance, item in record.instances.items()}
                self._services[key] = state
                self.writer.adopt(state)
                for instance, item in record.instances.items():
                    heard = (
                        self._heard.restore_expiry(instance, workspace, item.ttl, now)
                        if self._heard is not None
                        else None
                    )
                    self.leases.restore(instance, key, ttl=item.ttl, now=now, digest=record.digest, heard=heard)
                if (
                    self.pins is not None
                ):  # what the store holds for a pinned tool is its pin, until the service re-announces
                    state.digests = {
                        name: pin.digest
                        for name in state.tool_names()
                        if (pin := self.pins.get(workspace, name)) is not None
                    }
                if not record.instances:
                    self._mark(key)

    async def _restore_pins(self) -> None:
        """Read back the pins of every workspace the registry writes to, and the pending changes."""
        assert self.pins is not None
        for workspace in sorted(self.writer.indexed):
            self.pins.load_pins(workspace, await self._config.getvalues(PIN_TYPE, workspace=workspace))
        self.pins.load_pending(await self._config.getvalues(PENDING_TYPE, workspace=PROBE_WORKSPACE))
        log.info("registry.pins_restored", pins=len(self.pins), pending=len(self.pins.pending))

    # --- intake --------------------------------------------------------------

    async def _on_message(self, message: Envelope) -> None:
        data = message.data
        wall, now = time.time(), time.monotonic()
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
            await self._on_heartbeat(announcement, now, wall, message.properties.get(TOOL_STATS))
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
        new = self._reject(
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
                service=lease.service[1],
                workspace=lease.service[0],
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
                and lease.service != (announcement.workspace, announcement.service.id)
            ):
                moved = trust.check(announcement, lease.service[1], [], lease.service[0])
                if moved is not None:
                    return (
                        f"instance {announcement.instance} serves {lease.service[1]!r} in workspace"
                        f" {lease.service[0]!r}: {moved}"
                    )
            return refusal
        if lease is None:
            return trust.check(announcement, None, [])
        return trust.check(announcement, lease.service[1], [], lease.service[0])

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
        key = (announcement.workspace, announcement.service.id)
        lease = self.leases.get(announcement.instance)
        if lease is not None and lease.service == key:
            return None  # a renewal: no new state
        opts = self.options
        state = self._services.get(key)
        if state is not None and len(state.since) >= opts.max_instances_per_service:
            return (
                f"capacity: service {key[1]!r} already has {len(state.since)} instances, "
                f"the limit per service is {opts.max_instances_per_service}"
            )
        if len(self.leases) >= opts.max_instances:
            return f"capacity: the registry holds {len(self.leases)} instance leases, the limit is {opts.max_instances}"
        return None

    def _reject(
        self,
        reason: str,
        data: bytes,
        wall: float,
        *,
        instance: str | None = None,
        service: str | None = None,
        workspace: str | None = None,
        category: Category = "malformed",
    ) -> bool:
        """Log and count a refusal; True when it is new in the rejection log (not a repeat of the same sender)."""
        new = self.rejection_log.add(
            Rejection(
                at=wall, reason=reason, instance=instance, service=service, workspace=workspace, excerpt=excerpt(data)
            )
        )
        self.metrics.rejection(reason)
        log.warning(
            "announcement.rejected",
            reason=reason,
            instance=instance,
            service=service,
            workspace=workspace,
            bytes=len(data),
            category=category,
            repeated=not new,
        )
        return new

    async def _tell_conflicts(self, key: ServiceKey, conflicts: list[NameConflict]) -> None:
        """A service was refused tool names: list it with the rejections and tell its instances, in their log."""
        reason = "; ".join(conflict.reason for conflict in conflicts)
        self.rejection_log.add(
            Rejection(at=time.time(), reason=f"conflict: {reason}", service=key[1], workspace=key[0])
        )
        for lease in self.leases.of_service(key):
            await self._prober.notify(lease.instance, f"conflict: {reason}")

    async def _on_announce(
        self, announcement: Announcement, now: float, wall: float, link: SpanContext | None = None
    ) -> None:
        assert announcement.service is not None and announcement.tools is not None  # the model guarantees it
        key = (announcement.workspace, announcement.service.id)
        state = self._services.get(key)
        if state is None:
            state = self._services[key] = ServiceState(key, next(self._order))
        known = announcement.digest in state.offers
        signer = signature_key_id(announcement) if self.options.trust is not None else None
        state.offers[announcement.digest] = Offer(
            announcement.service, tuple(announcement.tools), announcement.digest, announcement.version, signer
        )
        if len(state.offers) > 2 * self.options.max_instances_per_service:
            self._forget_unused_offers(state, keep=announcement.digest)
        previous = self.leases.get(announcement.instance)
        lease, _ = self.leases.renew(
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
        if previous is not None and previous.service != key:
            self._mark(previous.service)  # the instance now serves another service id
        if previous is not None and previous.held:
            self._resume(now)
        # An offer seen for the first time (after a restart, say) is checked against
        # the store even if the record says nothing changed: conflicts live in memory.
        self._mark(key, force=not known, link=link)

    async def _on_heartbeat(
        self, announcement: Announcement, now: float, wall: float, stats: str | None = None
    ) -> None:
        """Renew the lease; `stats`, the heartbeat's `tool-stats` property, goes on it for the page (`usage`)."""
        lease = self.leases.get(announcement.instance)
        if lease is None or lease.service[0] != announcement.workspace:
            await self._prober.probe(announcement.instance, "heartbeat from an unknown instance")
            return
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
        state = self._services.get(lease.service)
        if lease.digest != announcement.digest:
            await self._prober.probe(announcement.instance, "heartbeat with an unknown digest")
        elif state is None or lease.digest not in state.offers:
            await self._prober.probe(announcement.instance, "descriptors not known since the registry started")
        elif stats is not None:
            self._heard_calls(lease, announcement, stats, {tool.name for tool in state.offers[lease.digest].tools})

    @staticmethod
    def _heard_calls(lease: Lease, announcement: Announcement, stats: str, tools: set[str]) -> None:
        """Keep a heartbeat's call counters on its lease, for the tools its instance offers. Unsigned and
        informational: a malformed property is ignored (at debug), never a reason to refuse the heartbeat."""
        try:
            heard = usage_sample(stats, announcement.sent_at, tools)
        except ValueError as exc:
            log.debug("heartbeat.stats_ignored", instance=lease.instance, service=lease.service[1], reason=str(exc))
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
        log.info("instance.withdrawn", service=lease.service[1], workspace=lease.service[0], instance=lease.instance)
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

    async def _on_push(self, push: ConfigPush) -> None:
        """Someone changed tools: a refused announcement may fit now (its holder left)."""
        self.writer.writes.observe(push)
        self.overview.observe(push.version)
        for item_type in ("tool", "tool-service"):
            self._recheck_conflicts(push.changes.get(item_type, []))

    def _recheck_conflicts(self, workspaces: list[str] | set[str]) -> None:
        for key in [key for key in self.writer.conflicted if key[0] in workspaces]:
            self._mark(key, force=True)

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
        """Whether the registry cannot reach the broker now, or did so less than `STALL_PAUSE` ago: then no lease
        expires.

        During a broker outage no heartbeat can arrive, and the registry's
        deletions could not be written anyway: expiring then would only
        remove every tool when the broker comes back and add it again a
        heartbeat later, a flap every agent sees. Once back, every service
        is asked to announce at once, so the leases renew within the pause.
        """
        if not self._prober.connected:
            if not self._disconnected:
                self._disconnected = True
                log.warning(
                    "registry.sweeps_paused",
                    reason="not connected to the broker",
                    note="no lease expires while no heartbeat can be heard",
                )
            self._sweeps_paused_until = now + STALL_PAUSE
            return True
        if self._disconnected:
            self._disconnected = False
            log.info("registry.reconnected", paused_s=STALL_PAUSE, note="every service is asked to announce again")
            await self._prober.probe(None, "the registry reconnected to the broker")
        return now < self._sweeps_paused_until

    async def _sweep(self) -> None:
        self._recheck_conflicts(self.departed.prune(time.time()))  # a kept name is free now
        now = time.monotonic()
        if self._stalled(now) or await self._deaf(now):
            return
        result = self.leases.sweep(now)
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
                service=key[1],
                workspace=key[0],
                instances=[lease.instance for lease in leases],
                ttl=leases[0].ttl,
                refused=refused,
            )
        if result.held:
            services = sorted({lease.service[1] for lease in result.held})
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

    def _report_state(self) -> None:
        """The gauges, after every write and every sweep that expired something: from counts kept as they change, not a
        pass over the fleet."""
        self.metrics.set_state(
            services=self.leases.service_count(),
            tools=self.writer.owners.tools,
            instances=len(self.leases),
            held=len(self.leases.held()),
        )

    def readiness(self) -> str | None:
        """None while the registry hears announcements and answers queries; else why not, in the broker's words. For
        `/readyz`.

        A topic the broker will not let it use (a revoked permission, an
        expired token, a deleted namespace: what the transport found, see
        `Transport.problem`) makes it not ready even while its other
        connections are fine: a registry deaf to announcements lets every
        lease run out.
        """
        if not self._running:
            return "not running"
        for _, doing, topic in self._topics():
            if (problem := self._connection.problem(topic)) is not None:
                return f"cannot {doing} on {topic}: {problem}"
        if not (self._prober.connected and self._server.connected):
            return f"not connected to the broker at {self._connection.url} (reconnecting)"
        return None

    def _topics(self) -> list[tuple[str, str, str]]:
        """(part, what it does there, topic) for each topic the intake and the query server cannot work without."""
        topics = self._connection.topics
        return [
            ("intake", "hear announcements", topics.tool_descriptors),
            ("intake", "send probes", topics.tool_probe),
            ("queries", "take queries", topics.registry_request),
            ("queries", "answer queries", topics.registry_response),
        ]

    async def _report_topics(self) -> None:
        """Log when the intake or the query server cannot use a topic, and why, and when it can again.

        The registry does not stop for it: pulsar-client keeps reconnecting,
        and a grant, a fresh token or a recreated namespace heals it.
        Meanwhile the reason is in the log (`registry.intake_failed`,
        `registry.queries_failed`) and in `readiness`.
        """
        for part, doing, topic in self._topics():
            problem = self._connection.problem(topic)
            if problem == self._reported.get(topic):
                continue
            if problem is None:
                del self._reported[topic]
                log.info(f"registry.{part}_restored", topic=topic)
            else:
                self._reported[topic] = problem
                log.warning(f"registry.{part}_failed", topic=topic, cannot=doing, reason=problem)

    def _mark(self, key: ServiceKey, *, force: bool = False, link: SpanContext | None = None) -> None:
        self.writer.mark(key, force=force, link=link)

    def _key_names(self) -> dict[str, str]:
        """Key id -> the trust policy's name for it (empty without a policy)."""
        keys = getattr(self.options.trust, "keys", None)
        return {kid: key.name for kid, key in keys.items()} if isinstance(keys, dict) else {}

    # --- queries -------------------------------------------------------------

    async def list_tools(self, workspace: str | None = None) -> list[ToolStatus]:
        """Announced tools the registry wrote, plus every other `tool/*` item (static), by name."""
        workspace = workspace or self.workspace_default
        wall = time.time()
        tools: dict[str, ToolStatus] = {}
        for state in self._services.values():
            if state.workspace == workspace:
                unwritten = self.writer.failure if self.writer.waiting(state.key) else None
                for status in state.tool_statuses(self.leases.of_service(state.key), wall, unwritten):
                    tools[status.name] = status
        static = {
            name: value
            for name, value in (await self._config.getvalues("tool", workspace=workspace)).items()
            if name not in tools
        }
        if static:
            services = await self._config.getvalues("tool-service", workspace=workspace)
            for name, value in static.items():
                tools[name] = static_status(name, value, services, workspace)
        return [tools[name] for name in sorted(tools)]

    def rejections(self) -> list[Rejection]:
        return self.rejection_log.items()

    def conflicts(self) -> list[NameConflict]:
        found = [
            conflict
            for key in self.writer.conflicted
            if (state := self._services.get(key))
            for conflict in state.conflicts.values()
        ]
        return sorted(found, key=lambda c: (c.at, c.workspace, c.tool, c.service))

    def held_services(self) -> list[str]:
        return sorted({lease.service[1] for lease in self.leases.held()})

    def release(self) -> list[str]:
        """The operator confirms the held deletions: those instances are dropped now."""
        released = self.leases.release_held()
        services = sorted({lease.service for lease in released})
        for key in services:
            self._mark(key)
        if released:
            log.warning("registry.released", services=[key[1] for key in services], leases=len(released), by="operator")
        return [key[1] for key in services]

    def pending(self) -> list[PendingChange]:
        """Held definition changes of every workspace, by workspace and tool; empty without `--pin-definitions`."""
        if self.pins is None:
            return []
        names = self._key_names()
        found = [
            self.pins.change(key, self._last_offered(key, pending), names)
            for key, pending in sorted(self.pins.pending.items())
        ]
        return [change for change in found if change is not None]

    def _last_offered(self, key: tuple[str, str], pending: Pending) -> float | None:
        """When an instance offering the held definition was last heard from (None: none holds a lease)."""
        state = self._services.get((key[0], pending.service))
        if state is None:
            return None
        seen = [
            lease.last_seen
            for lease in self.leases.of_service(state.key)
            if lease.last_seen is not None
            and (offer := state.offers.get(lease.digest or "")) is not None
            and offer.digests.get(key[1]) == pending.offered
        ]
        return max(seen, default=None)

    async def approve(
        self, tool: str, workspace: str | None = None, digest: str | None = None, *, wait: float = 2.0
    ) -> tuple[PendingChange, bool]:
        """Pin the definition offered for `tool` and write it; returns the change and whether it was written within
        `wait` seconds.

        Raises `PinError` (its `code` is the query API's error type) for an unknown
        tool, a tool with nothing pending, or a `digest` that is not the offered one.
        """
        workspace = workspace or self.workspace_default
        pins, pending, change = await self._decision(tool, workspace, digest)
        pin = pins.approve(pending, time.time())
        log.warning(
            "definition.approved",
            tool=tool,
            workspace=workspace,
            service=pending.service,
            digest=pin.digest,
            previous=change.pinned,
            by="operator",
        )
        for state in self._services.values():
            if state.workspace == workspace and any(tool in offer.digests for offer in state.offers.values()):
                self._mark(state.key, force=True)
        self.writer.wake()
        try:
            await self.writer.settle(timeout=wait)
        except TimeoutError:
            return change, False
        return change, True

    async def reject(self, tool: str, workspace: str | None = None, digest: str | None = None) -> PendingChange:
        """Keep `tool`'s pin and refuse the offered definition from now on; its instances are told. Same errors as
        `approve`."""
        workspace = workspace or self.workspace_default
        pins, pending, change = await self._decision(tool, workspace, digest)
        pins.reject(pending)
        reason = rejected_reason(tool, pending.offered, change.pinned)
        log.warning(
            "definition.rejected",
            tool=tool,
            workspace=workspace,
            service=pending.service,
            digest=pending.offered,
            pinned=change.pinned,
            by="operator",
        )
        state = self._services.get((workspace, pending.service))
        if state is not None:
            for lease in self.leases.of_service(state.key):
                offer = state.offers.get(lease.digest or "")
                if offer is not None and offer.digests.get(tool) == pending.offered:
                    await self._prober.notify(lease.instance, reason)
        self.writer.wake()
        try:
            await self.writer.settle(timeout=2.0)
        except TimeoutError:
            pass
        return change

    async def _decision(self, tool: str, workspace: str, digest: str | None) -> tuple[PinBook, Pending, PendingChange]:
        """The pending change an operator decides on, or `PinError` saying why there is none."""
        if self.pins is None:
            raise PinError(
                "not-pinning",
                "this registry does not pin definitions (start it with --pin-definitions): nothing is ever pending",
            )
        pins = self.pins
        if pins.get(workspace, tool) is None and (workspace, tool) not in pins.pending:
            if self.writer.owners.owner(workspace, ("tool", tool)) is None:
                item = (await self._config.get([("tool", tool)], workspace=workspace)).get(("tool", tool))
                if item is None:
                    raise PinError("not-found", f"no tool {tool!r} in workspace {workspace!r}")
                raise PinError(
                    "static", f"tool {tool!r} is static (written by hand, not announced): static tools are not pinned"
                )
        pending = pins.decide(workspace, tool, digest)
        change = pins.change((workspace, tool), None, self._key_names())
        assert change is not None
        return pins, pending, change

    async def _handle(self, message: Envelope, reply: Any) -> None:
        data = message.data
        if len(data) > MAX_QUERY_BYTES:
            log.warning("registry.query_rejected", reason="too large", bytes=len(data))
            await reply(
                RegistryResponse(
                    error=ErrorBody(
                        type="bad-request",
                        message=f"bad registry request: {len(data)} bytes; the limit is {MAX_QUERY_BYTES}",
                    )
                )
            )
            return
        try:
            request = RegistryRequest.model_validate_json(data)
        except ValidationError as exc:
            reason = describe_validation_error(exc)
            log.warning("registry.query_rejected", reason=reason)
            await reply(
                RegistryResponse(error=ErrorBody(type="bad-request", message=f"bad registry request: {reason}"))
            )
            return
        workspace = request.workspace or self.workspace_default
        try:
            response = await self._answer(request, workspace)
        except (RequestTimeout, ConfigError) as exc:
            response = RegistryResponse(
                error=ErrorBody(type="store-unavailable", message=f"the config store did not answer: {exc}")
            )
        except PinError as exc:
            response = RegistryResponse(error=ErrorBody(type=exc.code, message=str(exc)))
        await reply(response)

    async def _answer(self, request: RegistryRequest, workspace: str) -> RegistryResponse:
        op = request.operation
        pinning = True if self.pins is not None else None  # left out when off: the answer is as it always was
        if op == "list":
            tools = await self.list_tools(workspace)
            if request.limit is None and request.after is None:
                return RegistryResponse(tools=tools, held=self.held_services(), pinning=pinning)
            page, more = page_of(tools, request.after, request.limit or MAX_PAGE_ITEMS)
            return RegistryResponse(tools=page, held=self.held_services(), more=more, pinning=pinning)
        if op == "get":
            if not request.name:
                return RegistryResponse(error=ErrorBody(type="bad-request", message="operation 'get' needs 'name'"))
            match = [tool for tool in await self.list_tools(workspace) if tool.name == request.name]
            if not match:
                return RegistryResponse(
                    error=ErrorBody(type="not-found", message=f"no tool {request.name!r} in workspace {workspace!r}")
                )
            return RegistryResponse(tool=match[0], held=self.held_services())
        if op == "rejections":
            return RegistryResponse(rejections=self.rejections())
        if op == "conflicts":
            return RegistryResponse(conflicts=self.conflicts())
        if op == "pending":
            return RegistryResponse(pending=self.pending(), pinning=self.pins is not None)
        if op in ("approve", "reject"):
            if not request.name:
                return RegistryResponse(error=ErrorBody(type="bad-request", message=f"operation {op!r} needs 'name'"))
            if op == "reject":
                return RegistryResponse(decided=await self.reject(request.name, workspace, request.digest))
            change, applied = await self.approve(request.name, workspace, request.digest)
            return RegistryResponse(decided=change, applied=applied)
        return RegistryResponse(released=self.release(), held=self.held_services())

"""The registry: announced tool services, merged into the config store while they live.

`Registry` wires the rooms together and runs their life cycle; each concern
is a module of its own, sharing the registry's memory (the services and the
lease table):

- `intake` judges every message on `tool-descriptors` (`validation`, `trust`,
  the caps, `pins`) and turns it into leases and dirty services;
- `expiry` runs the lease sweep and the policy around it (self-preservation,
  no expiry after a stall or while the broker cannot be heard);
- `writer` (over `batches`) does every store write, batched on the leading
  edge (a lone change is written at once, a burst becomes a few versions);
- `queries` answers the query API on `tool-registry` (`list`, `get`,
  `rejections`, `conflicts`, `release`, and for pinned definitions
  `pending`, `approve` and `reject`);
- `restore` reads back, at start, what the previous run left in the store;
- `topic_watch` says whether the intake and the query server can use their
  topics (`readiness`, and the log).

Start-up (`restore`): ownership records are read back, every recorded instance
gets one ttl of grace, and a probe asks live services to re-announce. A
service that died while the registry was down simply never answers and expires
after the grace; one that lives keeps its tools without a single store write.
A registry elected from standby (`replicated`) starts warm instead: each
recorded lease ends when what it heard as a standby says (`heard`), with no
grace. What the previous run kept of departures (`departed`: withdrawn
instances, names kept for a service that went) is read back too, so a restart
opens no window for a replayed message and hands no name over early.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Self

from discovery.errors import RegistryError
from toolservice_base.configclient import ConfigClient, Requests, watch_config
from toolservice_base.errors import ConfigError, RequestTimeout
from toolservice_base.logs import get_logger
from toolservice_base.rpc import RequestServer, error_body
from toolservice_base.schemas import ConfigPush, ConfigRequest
from toolservice_base.search import ranker_for
from toolservice_base.tasks import cancel_and_wait
from toolservice_base.transport import Subscription, Transport, unique_name

from .book import ServiceBook
from .callers import CallerBook
from .departed import Departed
from .expiry import Expiry
from .heard import HeardLeases
from .intake import Intake
from .leases import LeaseTable
from .metrics import RegistryMetrics
from .options import RegistryOptions
from .overview import Overview, trust_view
from .pins import PinBook
from .probes import ProbeLimiter, Prober
from .protocol import NameConflict, PendingChange, Rejection, ToolStatus
from .queries import Queries
from .refusals import Refusals
from .restore import Restore
from .topic_watch import TOPIC_CHECK, TopicWatch
from .validation import SEQUENCE_MEMORY, AnnouncementValidator, RejectionLog
from .writer import StoreWriter

__all__ = ["ProbeLimiter", "Registry", "RegistryOptions"]

log = get_logger("discovery.registry")

DESCRIPTOR_PERMITS = 10_000
"""Receiver queue on `tool-descriptors`. The topic is non-persistent: the broker drops what a consumer has
no permits for, so a burst beyond the queue is lost, not delayed. 1,000 (the default) dropped heartbeats
from 8,700/s up on 2 cores; 10,000 (~2 MB of heartbeats) absorbs a second of burst (`make bench`, throughput)."""
DESCRIPTOR_LINGER = 0.02
"""Seconds a message on `tool-descriptors` may wait for others under a steady stream (`Transport.subscribe`'s
`linger`): the loop takes what came in one look, no thread woken per message; after a quiet spell a message is
taken at once. 2,000 instances at 400 heartbeats/s cost 9.5 % of a core with none, 5.4 % at 20 ms taken message by
message, 3.8 % in one batch a look (bench/PROFILE.md)."""


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
        requests: Requests | None = None,
        sign: Callable[[ConfigRequest], ConfigRequest] | None = None,
    ) -> None:
        """`heard`: what this process heard as a standby (`heard`); the recorded leases start from it, not from a ttl of
        grace. `requests`: how to reach the store other than its queues (the store of this very process); `sign`: how
        its writes are signed, for a store whose trust policy covers the config queue."""
        self._connection = connection
        self._heard = heard
        self.workspace_default = workspace_default
        self.options = opts = options or RegistryOptions()
        self.metrics = metrics or RegistryMetrics.default()
        self.leases = LeaseTable(threshold=opts.self_preservation_share, minimum=opts.self_preservation_min)
        self.validator = AnnouncementValidator(
            opts.allowed_namespaces or connection.topics.queue_namespaces,
            max_skew=opts.max_clock_skew,
            memory=max(SEQUENCE_MEMORY, 2 * opts.max_instances),
        )
        self.rejection_log = RejectionLog(opts.max_rejections)
        self.book = ServiceBook()
        """Every announced service, between store writes: the rooms change it only through the book."""
        self.callers = CallerBook(fronts=opts.audit_fronts)
        self.departed = Departed()
        self.pins = PinBook(opts.auto_approve) if opts.pin_definitions else None
        """Pinned definitions and held changes (`pins`); None without `--pin-definitions`."""
        self._config = ConfigClient(
            connection, workspace=workspace_default, timeout=opts.store_timeout, requests=requests, sign=sign
        )
        self._prober = Prober(connection, interval=opts.probe_interval, per_second=opts.max_probes_per_second)
        self.refusals = Refusals(self.rejection_log, self.metrics, self.leases, self._prober)
        self.writer = self._writer()
        self.intake = self._intake()
        """Every message on `tool-descriptors`, judged and applied to memory."""
        self.expiry = self._expiry()
        """The lease sweep and when it may run."""
        self.queries = self._queries()
        """The query API's answers."""
        self.overview = self._overview()
        """What the registry page shows (`await registry.overview.snapshot()`), read-only."""
        self._descriptors: Subscription | None = None
        self._watch: Subscription | None = None
        self._server = self._query_server()
        self._topic_watch = TopicWatch(connection)
        """Whether the intake and the query server can use their topics (`readiness`, and the log)."""
        self._sweeps: asyncio.Task[None] | None = None
        self._running = False
        self._resources = AsyncExitStack()

    def _writer(self) -> StoreWriter:
        """The one task that writes to the store; a refusal or conflict it meets is told through the intake."""
        return StoreWriter(
            self._config,
            self.book,
            self.leases,
            workspace_default=self.workspace_default,
            max_retry_delay=self.options.max_retry_delay,
            metrics=self.metrics,
            on_merged=self._report_state,
            refusals=self.refusals,
            departed=self.departed,
            pins=self.pins,
        )

    def _intake(self) -> Intake:
        return Intake(
            book=self.book,
            leases=self.leases,
            writer=self.writer,
            prober=self._prober,
            options=self.options,
            metrics=self.metrics,
            validator=self.validator,
            refusals=self.refusals,
            departed=self.departed,
            pins=self.pins,
        )

    def _expiry(self) -> Expiry:
        return Expiry(
            leases=self.leases,
            writer=self.writer,
            prober=self._prober,
            options=self.options,
            metrics=self.metrics,
            departed=self.departed,
            report_state=self._report_state,
            inbound=lambda: self.book.heard_at,
        )

    def _queries(self) -> Queries:
        return Queries(
            services=self.book,
            leases=self.leases,
            writer=self.writer,
            config=self._config,
            prober=self._prober,
            options=self.options,
            rejection_log=self.rejection_log,
            pins=self.pins,
            workspace_default=self.workspace_default,
        )

    def _query_server(self) -> RequestServer:
        """The query API on `tool-registry`; an answer over the broker's limit says how to ask in pages."""
        topics = self._connection.topics
        return RequestServer(
            self._connection,
            topics.registry_request,
            topics.registry_response,
            self.queries.handle,
            subscription="tool-registry",
            too_large=lambda reason: error_body(
                "answer-too-large", f"{reason}; ask for `list` in pages (`limit`, `after`)"
            ),
        )

    def _overview(self) -> Overview:
        return Overview(
            services=self.book,
            leases=self.leases,
            config=self._config,
            rejections=self.rejection_log,
            conflicts=self.queries.conflicts,
            key_names=self.queries.key_names,
            workspace_default=self.workspace_default,
            pending=self.queries.pending if self.pins is not None else None,
            trust=trust_view(self.options.trust),
            ranker=ranker_for(self.options.search_embedder, self.options.search_embedder_key),
            callers=self.callers if self.options.follow_audit else None,
        )

    # --- life cycle ----------------------------------------------------------

    async def start(self) -> None:
        """Each step registers its undo as it succeeds: a failure half-way leaves nothing open."""
        connection, topics = self._connection, self._connection.topics
        async with AsyncExitStack() as stack:
            await self._config.start()
            stack.push_async_callback(self._config.close)
            try:
                await self.writer.writes.detect()
                await self._restore().run()
            except (RequestTimeout, ConfigError) as exc:
                raise RegistryError(f"the config store did not answer ({exc}); start it first (`toolreg up`)") from None
            await self._prober.start()
            stack.push_async_callback(self._prober.stop)
            self._descriptors = await connection.subscribe(
                topics.tool_descriptors,
                self.intake.on_message,
                subscription=unique_name("tool-registry"),
                receiver_queue=DESCRIPTOR_PERMITS,
                linger=DESCRIPTOR_LINGER,
            )
            stack.push_async_callback(self._stop_intake)
            self._watch = await watch_config(connection, self._on_push)
            stack.push_async_callback(connection.unsubscribe, self._watch)
            await self._server.start()
            stack.push_async_callback(self._server.stop, 2.0)
            self.writer.start()
            stack.push_async_callback(self._finish_writes)
            self._sweeps = asyncio.create_task(self._periodic(), name="registry-sweeps")
            stack.push_async_callback(self._stop_sweeps)
            if self.options.follow_audit:
                following = asyncio.create_task(self.callers.follow(connection), name="registry-audit")
                stack.push_async_callback(_cancelled, following)
            self._running = True
            await self._prober.probe(None, "registry started")
            self._resources = stack.pop_all()
        self._log_started()

    def _log_started(self) -> None:
        """What it started with, and whether it checks who signed an announcement (a warning if not)."""
        warm = None if self._heard is None else sum(1 for lease in self.leases if not lease.grace)
        log.info(
            "registry.started",
            services=len(self.book),
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
                keys=len(self.options.trust.keys),
                path=str(self.options.trust.path),
            )

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self, *, flush: bool = True) -> None:
        """Stop taking messages, finish pending writes (briefly), close. The store keeps what was merged.

        `flush=False` writes nothing more: for a replica that was deposed, whose pending writes come from a view
        that stopped while another registry was active (its leases ran out unheard while it was frozen). Safe at
        any point: before `start()`, after a failed one, twice.
        """
        was_running, self._running = self._running, False
        await self._stop_sweeps()
        if not flush:
            await self.writer.stop()  # first: no pending write reaches the store from here on
        await self._stop_intake()
        await self._resources.aclose()
        await self.overview.finder.close()
        if was_running:
            log.info("registry.stopped")

    async def _periodic(self) -> None:
        """The lease sweep (`expiry`) and the look at the topics (`topic_watch`), on one timer.

        Sweeps keep to the ticks of `sweep_interval` from the start, as a job
        every interval would, but the timer sleeps through the ticks at which
        nothing can run out (`Expiry.due_at`), up to the next look at the
        topics, every `TOPIC_CHECK`, which sweeps too: an idle registry wakes
        once a second instead of five times, and a steady fleet's leases,
        renewed long before they end, ask for no tick of their own.
        """
        interval = self.options.sweep_interval
        every = max(1, round(TOPIC_CHECK / interval))  # ticks from one look at the topics to the next
        origin = time.monotonic()
        while True:
            now = time.monotonic()
            upcoming = math.floor((now - origin) / interval) + 1
            look = -(-upcoming // every) * every
            due = min(self.expiry.due_at(now), origin + look * interval)
            tick = upcoming if due <= now else max(upcoming, math.ceil((due - origin) / interval))
            await asyncio.sleep(origin + tick * interval - time.monotonic())
            try:
                if tick % every == 0:
                    await self._topic_watch.report()
                await self.expiry.sweep()
            except Exception:  # one failed sweep must not end the sweeps
                log.exception("registry.sweep_failed")

    async def _stop_sweeps(self) -> None:
        if self._sweeps is not None:
            sweeps, self._sweeps = self._sweeps, None
            await cancel_and_wait(sweeps)

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

    def _restore(self) -> Restore:
        """What the previous run left in the store, read back before a message is taken (`restore`)."""
        return Restore(
            config=self._config,
            writer=self.writer,
            book=self.book,
            leases=self.leases,
            departed=self.departed,
            validator=self.validator,
            pins=self.pins,
            heard=self._heard,
        )

    async def _on_push(self, push: ConfigPush) -> None:
        """Someone changed tools: a refused announcement may fit now (its holder left)."""
        self.writer.writes.observe(push)
        self.overview.observe(push.version)
        for item_type in ("tool", "tool-service"):
            self.writer.recheck_conflicts(push.changes.get(item_type, []))

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
        `/readyz`: a topic it cannot use makes it not ready even while its connections are fine (`topic_watch`)."""
        if not self._running:
            return "not running"
        if (problem := self._topic_watch.problem()) is not None:
            return problem
        if not (self._prober.connected and self._server.connected):
            return f"not connected to the broker at {self._connection.url} (reconnecting)"
        return None

    # --- queries: the query API's answers (`queries`), for code that holds the registry ---

    async def list_tools(self, workspace: str | None = None) -> list[ToolStatus]:
        """Announced tools the registry wrote, plus every other `tool/*` item (static), by name."""
        return await self.queries.list_tools(workspace)

    def rejections(self) -> list[Rejection]:
        return self.queries.rejections()

    def conflicts(self) -> list[NameConflict]:
        return self.queries.conflicts()

    def held_services(self) -> list[str]:
        return self.queries.held_services()

    def release(self) -> list[str]:
        """The operator confirms the held deletions: those instances are dropped now."""
        return self.queries.release()

    def pending(self) -> list[PendingChange]:
        """Held definition changes of every workspace, by workspace and tool; empty without `--pin-definitions`."""
        return self.queries.pending()

    async def approve(
        self, tool: str, workspace: str | None = None, digest: str | None = None, *, wait: float = 2.0
    ) -> tuple[PendingChange, bool]:
        """Pin the definition offered for `tool` and write it (`Queries.approve`)."""
        return await self.queries.approve(tool, workspace, digest, wait=wait)

    async def reject(self, tool: str, workspace: str | None = None, digest: str | None = None) -> PendingChange:
        """Keep `tool`'s pin and refuse the offered definition from now on (`Queries.reject`)."""
        return await self.queries.reject(tool, workspace, digest)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

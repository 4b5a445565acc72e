"""The registry's answers: the query API on `tool-registry` and the operator's decisions behind it.

`list`, `get`, `rejections` and `conflicts` read the registry's memory (and,
for static tools, the store); `release` confirms the deletions
self-preservation holds; under `--pin-definitions` (`pins`), `pending`,
`approve` and `reject` decide on held definitions. Each answer is one
`RegistryResponse`; a request the registry cannot read is answered with
`bad-request`, never dropped, and a store that does not answer is named as
such (`store-unavailable`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

from pydantic import ValidationError

from toolservice_base.configclient import ConfigClient
from toolservice_base.errors import ConfigError, RequestTimeout
from toolservice_base.logs import get_logger
from toolservice_base.schemas import MAX_PAGE_ITEMS, MAX_QUERY_BYTES, ErrorBody, describe_validation_error
from toolservice_base.transport import Envelope

from .decisions import SignedDecisions
from .leases import LeaseTable, ServiceKey
from .options import RegistryOptions
from .paging import page_of
from .pins import Pending, PinBook, PinError, rejected_reason
from .probes import Prober
from .protocol import NameConflict, PendingChange, RegistryRequest, RegistryResponse, Rejection, ToolStatus
from .state import ServiceState, held_statuses, static_status
from .trust import TrustPolicy
from .usage import live_usage
from .validation import RejectionLog
from .writer import StoreWriter

__all__ = ["Queries"]

log = get_logger("discovery.registry")


class Queries:
    """What the registry answers, to its query server (`handle`) and to code holding the `Registry`."""

    def __init__(
        self,
        *,
        services: Mapping[ServiceKey, ServiceState],
        leases: LeaseTable,
        writer: StoreWriter,
        config: ConfigClient,
        prober: Prober,
        options: RegistryOptions,
        rejection_log: RejectionLog,
        pins: PinBook | None,
        workspace_default: str,
    ) -> None:
        self._services = services
        self.leases = leases
        self.writer = writer
        self._config = config
        self._prober = prober
        self.options = options
        self.rejection_log = rejection_log
        self.pins = pins
        self.workspace_default = workspace_default
        trust = options.trust if isinstance(options.trust, TrustPolicy) else None
        self.decisions = SignedDecisions(trust, config.connection.topics.topicspace)

    def _mark(self, key: ServiceKey, *, force: bool = False) -> None:
        self.writer.mark(key, force=force)

    def key_names(self) -> dict[str, str]:
        """Key id -> the trust policy's name for it (empty without a policy)."""
        trust = self.options.trust
        return {} if trust is None else {kid: key.name for kid, key in trust.keys.items()}

    async def list_tools(self, workspace: str | None = None) -> list[ToolStatus]:
        """Announced tools the registry wrote, plus every other `tool/*` item (static), by name."""
        workspace = workspace or self.workspace_default
        wall = time.time()
        tools: dict[str, ToolStatus] = {}
        for state in self._services.values():
            if state.workspace == workspace:
                unwritten = self.writer.failure if self.writer.waiting(state.key) else None
                leases = self.leases.of_service(state.key)
                traffic = live_usage(leases)
                for status in state.tool_statuses(leases, wall, unwritten):
                    status.usage = traffic.get(status.name)
                    tools[status.name] = status
        tools.update(
            held_statuses(
                tools,
                [change for change in self.pending() if change.workspace == workspace],
                lambda service: len(self.leases.of_service(ServiceKey(workspace, service))),
                wall,
            )
        )
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
        return sorted({lease.service.service for lease in self.leases.held()})

    def release(self) -> list[str]:
        """The operator confirms the held deletions: those instances are dropped now."""
        released = self.leases.release_held()
        services = sorted({lease.service for lease in released})
        for key in services:
            self._mark(key)
        if released:
            log.warning(
                "registry.released", services=[key.service for key in services], leases=len(released), by="operator"
            )
        return [key.service for key in services]

    def pending(self) -> list[PendingChange]:
        """Held definition changes of every workspace, by workspace and tool; empty without `--pin-definitions`."""
        if self.pins is None:
            return []
        names = self.key_names()
        found = [
            self.pins.change(key, self._last_offered(key, pending), names)
            for key, pending in sorted(self.pins.pending.items())
        ]
        return [change for change in found if change is not None]

    def _last_offered(self, key: tuple[str, str], pending: Pending) -> float | None:
        """When an instance offering the held definition was last heard from (None: none holds a lease)."""
        state = self._services.get(ServiceKey(key[0], pending.service))
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
        state = self._services.get(ServiceKey(workspace, pending.service))
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
        change = pins.change((workspace, tool), None, self.key_names())
        assert change is not None
        return pins, pending, change

    async def handle(self, message: Envelope, reply: Callable[[RegistryResponse], Awaitable[None]]) -> None:
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
        if (refused := self.decisions.refusal(request)) is not None:
            log.warning("registry.decision_refused", operation=request.operation, tool=request.name, reason=refused)
            await reply(RegistryResponse(error=ErrorBody(type="not-authorized", message=refused)))
            return
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

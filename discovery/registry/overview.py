"""One read-only picture of the registry: what its page shows, built from its memory and the store.

Announced services, their instances and leases, conflicts, rejections, the
self-preservation hold and each announced tool's traffic (`usage`, from the
counters heartbeats carry) come from the registry's memory at no cost. Static
tools (items the registry does not own) and the store's version need the
store; they are read once and again only after a config push says the store
moved, so a page open all day costs the store nothing while nothing changes.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from pydantic import BaseModel, Field

from toolservice_base.configclient import ConfigClient, apply_changes
from toolservice_base.errors import ChangesUnavailable
from toolservice_base.schemas import ToolAnnotations, ToolDescriptor
from toolservice_base.search import Match, Ranker

from .callers import CallerBook, CallerView
from .leases import Lease, LeaseTable, ServiceKey
from .merge import Offer
from .protocol import NameConflict, PendingChange, Rejection, ToolStatus
from .search import ToolFinder, ToolSource, search_key, usage_health
from .state import ServiceState, held_statuses, static_status
from .usage import ToolUsage, live_usage
from .validation import RejectionLog, TrustCheck

STATIC_TYPES = ["tool", "tool-service"]
MAX_DESCRIPTION = 500
"""Characters of a tool's description shown; the rest is cut (the store has the whole text)."""


class InstanceView(BaseModel):
    id: str
    service: str
    workspace: str
    version: str
    signer: str
    """The trust policy's name for the key that signed the last announce; its key id if the policy does not know it; ''
    unsigned."""
    state: str
    """`live`, `grace` (restored at start, not heard from yet) or `held` (self-preservation)."""
    ttl: float
    last_seen: float | None
    """Wall clock of the instance's last message; the page shows `at - last_seen` against `ttl`.
    None: nothing heard since the registry restarted (an instance in its grace ttl)."""


class ToolView(BaseModel):
    name: str
    service: str | None
    workspace: str
    source: str
    status: str
    """The same status `toolreg tools` shows: both come from `state` (`tool_statuses`, `static_status`)."""
    instances: int
    description: str
    title: str | None = None
    """The tool's own display name (MCP's `title`), when it has one."""
    hints: str = ""
    """MCP's annotations in a few words (`read-only, closed world`); "" when it gives none."""
    detail: str = ""
    """Why the status is not plain `live`/`configured`, in one line: the page's WHY column, `toolreg tools`' WHY."""
    digest: str | None = None
    """sha256 of the tool's definition as the store holds it (`definition_digest`), as `toolreg tools` shows it."""
    usage: ToolUsage | None = None
    """Calls/s, errors/s and p95 from its live instances' heartbeats (`usage`); None: not known (static tools, older
    services). Not signed: what the services say of themselves, for the page only."""


class ReplicaView(BaseModel):
    """One replica of the group this registry belongs to, as `toolreg replicas` shows it."""

    id: str
    group: str
    role: str
    """`active` or `standby`."""
    pid: int
    host: str
    version: int
    """The last version of the replicated state it has applied."""
    since: float
    """When it took its current role (wall clock, its own)."""


class TrustView(BaseModel):
    """Whether announcements must be signed: what `toolreg up` prints on its `trust` line."""

    policy: str | None = None
    """The trust policy's file ('(in memory)' for one built in code); None: no policy, every valid announcement is
    accepted."""
    keys: int = 0
    """Keys the policy trusts."""
    auto_approve: str | None = None
    """The policy's `auto-approve` rule for held definitions, if any."""


def trust_view(trust: TrustCheck | None) -> TrustView:
    """The page's view of `RegistryOptions.trust`."""
    if trust is None:
        return TrustView()
    return TrustView(
        policy=str(trust.path) if trust.path else "(in memory)", keys=len(trust.keys), auto_approve=trust.auto_approve
    )


class RegistryIdentity(BaseModel):
    """Which registry this is: what a newcomer with several terminals open needs to tell them apart."""

    broker: str = ""
    """The broker's URL ('' if not known)."""
    topicspace: str = ""
    host: str = ""
    """The machine the registry runs on."""


class RegistrySnapshot(BaseModel):
    at: float
    """The registry's wall clock when this was built."""
    config_version: int | None
    held: list[str]
    tools: list[ToolView]
    instances: list[InstanceView]
    rejections: list[Rejection]
    """Newest first."""
    rejected_total: int
    conflicts: list[NameConflict]
    pinning: bool = False
    """The registry pins definitions (`--pin-definitions`): `digest` is what is pinned, `pending` what is held."""
    pending: list[PendingChange] = []
    """Held definition changes, each with its diff (as `toolreg pending`), by workspace and tool."""
    replicas: list[ReplicaView] = []
    """The registry's replica group, this one included (by id); empty when it does not run replicated."""
    identity: RegistryIdentity = Field(default_factory=RegistryIdentity)
    started: float | None = None
    """Wall clock when this registry started (a replica's: when it was last promoted); None if not known."""
    trust: TrustView | None = None
    """Whether a trust policy is on; None: not known to whoever built the snapshot."""
    callers: list[CallerView] | None = None
    """Calls per caller through the MCP fronts (from the audit topic), busiest first; None: not followed."""
    callers_unverified: int = 0
    """Audit records read but not counted as calls: not signed by a trusted front in its chain's order (forged,
    unsigned, replayed), or not records at all."""


def _identity(config: ConfigClient) -> RegistryIdentity:
    """Broker and topicspace from the connection the registry's config client uses, and this host."""
    return RegistryIdentity(
        broker=config.connection.url, topicspace=config.connection.topics.topicspace, host=socket.gethostname()
    )


def hints(annotations: Any) -> str:
    """A tool's MCP annotations in a few words, for the page: what a client would ask before calling it."""
    if not isinstance(annotations, dict) or not annotations:
        return ""
    try:
        said = ToolAnnotations.model_validate(annotations)
    except ValueError:
        return ""
    words = ["read-only" if said.read_only_hint else "destructive" if said.destructive else "not destructive"]
    if said.idempotent_hint:
        words.append("idempotent")
    words.append("open world" if said.open_world else "closed world")
    return ", ".join(words)


def _title(value: Any) -> str | None:
    return _description(value) if isinstance(value, str) and value else None


def _description(value: Any) -> str:
    text = value if isinstance(value, str) else ""
    return text if len(text) <= MAX_DESCRIPTION else text[: MAX_DESCRIPTION - 1] + "…"


def _static_view(name: str, value: str, services: Mapping[str, str], workspace: str) -> ToolView:
    """A tool item the registry does not own, with the status and reason `toolreg tools` gives it."""
    try:
        body = json.loads(value)
    except ValueError:
        body = None
    body = body if isinstance(body, dict) else {}
    status = static_status(name, value, services, workspace)
    return ToolView(
        name=name,
        service=status.service,
        workspace=workspace,
        source="static",
        status=status.status,
        instances=0,
        description=_description(body.get("description")),
        title=_title(body.get("title")),
        hints=hints(body.get("annotations")),
        detail=status.detail,
        digest=status.digest,
    )


def _offered_hints(tool: ToolDescriptor | None) -> str:
    return hints(tool.annotations.to_wire()) if tool is not None and tool.annotations is not None else ""


class Overview:
    """Builds `RegistrySnapshot`s over the registry's own state (shared, never written here)."""

    def __init__(
        self,
        *,
        services: Mapping[ServiceKey, ServiceState],
        leases: LeaseTable,
        config: ConfigClient,
        rejections: RejectionLog,
        conflicts: Callable[[], list[NameConflict]],
        key_names: Callable[[], Mapping[str, str]],
        workspace_default: str,
        pending: Callable[[], list[PendingChange]] | None = None,
        trust: TrustView | None = None,
        callers: CallerBook | None = None,
        ranker: Callable[[], Ranker] | None = None,
    ) -> None:
        self._services = services
        self._leases = leases
        self._config = config
        self._rejections = rejections
        self._conflicts = conflicts
        self._key_names = key_names
        self._pending = pending
        """Held definition changes; None: the registry does not pin definitions."""
        self.workspace_default = workspace_default
        self.trust = trust
        self.callers = callers
        """`trust_view(options.trust)`: whether the registry checks signatures, and against what; None: not told (the
        page says nothing)."""
        self.started = time.time()
        """The registry is built just before it starts; a promoted replica builds a fresh one."""
        self.identity = _identity(config)
        self.config_version: int | None = None
        """The newest store version seen (pushes and our reads); None until the first."""
        self._static: dict[str, tuple[int, Mapping[str, Mapping[str, str]]]] = {}
        """Workspace -> (version, {"tool": items, "tool-service": items}) as last read."""
        self.finder = ToolFinder(self.tool_sources, ranker)
        """The registry's index of its tools, for the page's search (`search`)."""

    def observe(self, version: int) -> None:
        """A config push: the store is at `version` now, so static tools may have changed."""
        if self.config_version is None or version > self.config_version:
            self.config_version = version

    async def _static_items(self, workspace: str) -> Mapping[str, Mapping[str, str]]:
        """The workspace's `tool` and `tool-service` items, read at one version: a static tool's status needs its
        service's item."""
        cached = self._static.get(workspace)
        if cached is not None and self.config_version is not None and cached[0] >= self.config_version:
            return cached[1]
        if cached is not None:  # what changed since, when the store can say: a page view costs the change
            try:
                version, delta = await self._config.changes(cached[0], STATIC_TYPES, workspace=workspace)
            except ChangesUnavailable:
                pass
            else:
                changed = apply_changes(cached[1], delta)
                self.observe(version)
                self._static[workspace] = (version, changed)
                return changed
        version, items = await self._config.read_types(STATIC_TYPES, workspace=workspace)
        self.observe(version)
        self._static[workspace] = (version, items)
        return items

    @staticmethod
    def _instance(state: ServiceState, lease: Lease, names: Mapping[str, str]) -> InstanceView:
        """One instance as the page shows it: the version of the offer it holds, its signer by the policy's name."""
        held_offer = state.offers.get(lease.digest) if lease.digest is not None else None
        version = (
            held_offer.version if held_offer is not None else (state.record.version if state.record is not None else "")
        )
        return InstanceView(
            id=lease.instance,
            service=state.service_id,
            workspace=state.workspace,
            version=version,
            signer=names.get(lease.signer, lease.signer) if lease.signer else "",
            state=lease.state,
            ttl=lease.ttl,
            last_seen=lease.last_seen,
        )

    def _shown_offer(self, state: ServiceState, leases: list[Lease]) -> Offer | None:
        """The offer whose descriptions the page shows: the newest a live lease announced (what the merge uses, read
        without its pruning); pinned, the one written (the newest may be held)."""
        if self._pending is not None:
            return state.merged
        announced = [lease for lease in leases if lease.announced and lease.digest in state.offers]
        newest = max(announced, key=lambda lease: lease.announced).digest if announced else None
        return state.offers.get(newest) if newest is not None else None

    async def _static_tools(self) -> AsyncIterator[tuple[str, str, str, Mapping[str, str]]]:
        """(workspace, name, item, the workspace's tool-service items) of every `tool` item in the store, the
        registry's own included, in the default workspace and every workspace a service announced in."""
        for workspace in sorted({self.workspace_default} | {key.workspace for key in self._services}):
            items = await self._static_items(workspace)
            for name, value in items.get("tool", {}).items():
                yield workspace, name, value, items.get("tool-service", {})

    async def tool_sources(self) -> dict[str, ToolSource]:
        """Every tool the page lists, by `search_key`, as the search reads it (`search.ToolSource`): no copy, and the
        same objects from call to call while nothing changes."""
        grouped = self._leases.by_service()
        sources: dict[str, ToolSource] = {}
        for key, state in self._services.items():
            offer = self._shown_offer(state, grouped.get(key, []))
            described = {tool.name: tool for tool in offer.tools} if offer is not None else {}
            for name in state.tool_names():
                sources[search_key(state.workspace, name)] = described.get(name)
        async for workspace, name, value, _ in self._static_tools():
            sources.setdefault(search_key(workspace, name), value)
        return sources

    async def search(self, query: str, limit: int, among: RegistrySnapshot) -> list[Match]:
        """The tools of `among` (a snapshot the page shows) that best match `query`, best first, by the health shown
        there (`search.ToolFinder`); a match's `name` is its `search_key`. `BadQuery` for a query out of bounds."""
        shown = {search_key(t.workspace, t.name): usage_health(t.status, t.usage) for t in among.tools}
        return await self.finder.search(query, limit, shown)

    def _add_held(
        self, tools: dict[tuple[str, str], ToolView], grouped: Mapping[ServiceKey, list[Lease]], wall: float
    ) -> None:
        """Tools held by pinning, as `toolreg tools` lists them (`state.held_statuses`)."""
        if self._pending is None:
            return
        changes = self._pending()
        for workspace in sorted({change.workspace for change in changes}):
            listed = {
                name: ToolStatus(
                    name=name,
                    service=view.service,
                    source="announced",
                    status=view.status,
                    instances=view.instances,
                    detail=view.detail,
                )
                for (ws, name), view in tools.items()
                if ws == workspace and view.source == "announced"
            }
            held = held_statuses(
                listed,
                [change for change in changes if change.workspace == workspace],
                lambda service: len(grouped.get(ServiceKey(workspace, service), [])),  # noqa: B023 - used at once
                wall,
            )
            for name, status in held.items():
                shown = tools.get((workspace, name))
                tools[(workspace, name)] = (
                    shown.model_copy(update={"detail": status.detail})
                    if shown is not None
                    else _announced_view(status, None, None)
                )

    async def snapshot(self) -> RegistrySnapshot:
        wall = time.time()
        grouped = self._leases.by_service()
        names = self._key_names()
        tools: dict[tuple[str, str], ToolView] = {}
        instances: list[InstanceView] = []
        for key, state in sorted(self._services.items()):
            leases = grouped.get(key, [])
            offer = self._shown_offer(state, leases)
            described = {tool.name: tool for tool in offer.tools} if offer is not None else {}
            traffic = live_usage(leases)
            for status in state.tool_statuses(leases, wall):
                tools[(state.workspace, status.name)] = _announced_view(
                    status, described.get(status.name), traffic.get(status.name)
                )
            instances += [self._instance(state, lease, names) for lease in sorted(leases, key=lambda x: x.instance)]
        self._add_held(tools, grouped, wall)
        async for workspace, name, value, services in self._static_tools():
            if (workspace, name) not in tools:
                tools[(workspace, name)] = _static_view(name, value, services, workspace)
        return RegistrySnapshot(
            at=wall,
            config_version=self.config_version,
            held=sorted({lease.service.service for lease in self._leases.held()}),
            tools=[tools[key] for key in sorted(tools)],
            instances=instances,
            rejections=list(reversed(self._rejections.items())),
            rejected_total=self._rejections.total,
            conflicts=self._conflicts(),
            pinning=self._pending is not None,
            pending=self._pending() if self._pending is not None else [],
            identity=self.identity,
            started=self.started,
            trust=self.trust,
            callers=self.callers.views() if self.callers is not None else None,
            callers_unverified=self.callers.unverified if self.callers is not None else 0,
        )


def _announced_view(status: ToolStatus, tool: ToolDescriptor | None, usage: ToolUsage | None) -> ToolView:
    """An announced tool's row: its status, and what its offer says of it (`tool`; None for one held by pinning)."""
    return ToolView(
        name=status.name,
        service=status.service,
        workspace=status.workspace,
        source="announced",
        status=status.status,
        instances=status.instances,
        description=_description(getattr(tool, "description", "")),
        title=_title(getattr(tool, "title", None)),
        hints=_offered_hints(tool),
        detail=status.detail,
        digest=status.digest,
        usage=usage,
    )

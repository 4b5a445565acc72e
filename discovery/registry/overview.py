"""One read-only picture of the registry: what its page shows, built from its memory and the store.

Announced services, their instances and leases, conflicts, rejections and the
self-preservation hold come from the registry's memory at no cost. Static
tools (items the registry does not own) and the store's version need the
store; they are read once and again only after a config push says the store
moved, so a page open all day costs the store nothing while nothing changes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from toolservice_base.configclient import ConfigClient

from .leases import LeaseTable, ServiceKey
from .protocol import NameConflict, Rejection
from .state import ServiceState, service_status
from .validation import RejectionLog

MAX_DESCRIPTION = 500
"""Characters of a tool's description shown; the rest is cut (the store has the whole text)."""


class InstanceView(BaseModel):
    id: str
    service: str
    workspace: str
    version: str
    signer: str
    """The trust policy's name for the key that signed the last announce; its key id if the policy does not know it; '' unsigned."""
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
    instances: int
    description: str


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


def _description(value: Any) -> str:
    text = value if isinstance(value, str) else ""
    return text if len(text) <= MAX_DESCRIPTION else text[: MAX_DESCRIPTION - 1] + "…"


def _static_view(name: str, value: str, workspace: str) -> ToolView:
    try:
        body = json.loads(value)
    except ValueError:
        body = None
    body = body if isinstance(body, dict) else {}
    service = body.get("service")
    return ToolView(
        name=name,
        service=service if isinstance(service, str) else None,
        workspace=workspace,
        source="static",
        status="configured",
        instances=0,
        description=_description(body.get("description")),
    )


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
    ) -> None:
        self._services = services
        self._leases = leases
        self._config = config
        self._rejections = rejections
        self._conflicts = conflicts
        self._key_names = key_names
        self.workspace_default = workspace_default
        self.config_version: int | None = None
        """The newest store version seen (pushes and our reads); None until the first."""
        self._static: dict[str, tuple[int, dict[str, str]]] = {}

    def observe(self, version: int) -> None:
        """A config push: the store is at `version` now, so static tools may have changed."""
        if self.config_version is None or version > self.config_version:
            self.config_version = version

    async def _static_tools(self, workspace: str) -> dict[str, str]:
        cached = self._static.get(workspace)
        if cached is not None and self.config_version is not None and cached[0] >= self.config_version:
            return cached[1]
        version = await self._config.version(workspace=workspace)  # first: a write after it is seen by the next push
        items = await self._config.getvalues("tool", workspace=workspace)
        self.observe(version)
        self._static[workspace] = (version, items)
        return items

    async def snapshot(self) -> RegistrySnapshot:
        wall = time.time()
        grouped = self._leases.by_service()
        names = self._key_names()
        tools: dict[tuple[str, str], ToolView] = {}
        instances: list[InstanceView] = []
        for key, state in sorted(self._services.items()):
            leases = grouped.get(key, [])
            announced = [lease for lease in leases if lease.announced and lease.digest in state.offers]
            newest = max(announced, key=lambda lease: lease.announced).digest if announced else None
            offer = state.offers.get(newest) if newest is not None else None  # what the merge uses, read without its pruning
            described = {tool.name: tool.description for tool in offer.tools} if offer is not None else {}
            status = service_status(leases)
            for name in state.tool_names():
                tools[(state.workspace, name)] = ToolView(
                    name=name, service=state.service_id, workspace=state.workspace, source="announced", status=status,
                    instances=len(leases), description=_description(described.get(name, "")),
                )
            for lease in sorted(leases, key=lambda lease: lease.instance):
                held_offer = state.offers.get(lease.digest) if lease.digest is not None else None
                version = held_offer.version if held_offer is not None else (state.record.version if state.record is not None else "")
                instances.append(InstanceView(
                    id=lease.instance, service=state.service_id, workspace=state.workspace, version=version,
                    signer=names.get(lease.signer, lease.signer) if lease.signer else "", state=lease.state,
                    ttl=lease.ttl, last_seen=lease.last_seen,
                ))
        workspaces = {self.workspace_default} | {key[0] for key in self._services}
        for workspace in sorted(workspaces):
            for name, value in (await self._static_tools(workspace)).items():
                if (workspace, name) not in tools:
                    tools[(workspace, name)] = _static_view(name, value, workspace)
        return RegistrySnapshot(
            at=wall,
            config_version=self.config_version,
            held=sorted({lease.service[1] for lease in self._leases.held()}),
            tools=[tools[key] for key in sorted(tools)],
            instances=instances,
            rejections=list(reversed(self._rejections.items())),
            rejected_total=self._rejections.total,
            conflicts=self._conflicts(),
        )

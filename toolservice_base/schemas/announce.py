"""Self-announcement (DESIGN section 4): announcements, heartbeats, withdrawals and probes."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from .base import (
    DEFAULT_TTL,
    MAX_TOOLS_PER_SERVICE,
    MAX_VERSION,
    NAME_PATTERN,
    WireModel,
    canonical_json,
    kebab,
)
from .tools import ToolDescriptor, ToolServiceDescriptor, check_tool_against_service

# --- self-announcement (spec section 4) ------------------------------------

AnnouncementKind = Literal["announce", "heartbeat", "withdraw"]


def descriptor_digest(service: ToolServiceDescriptor, tools: list[ToolDescriptor]) -> str:
    """sha256 of the canonical JSON of service + tools: the same offer, the same digest."""
    body = {"service": service.to_wire(), "tools": sorted((t.to_wire() for t in tools), key=lambda t: t["name"])}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


class Announcement(WireModel):
    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, frozen=True, extra="forbid")

    kind: AnnouncementKind
    instance: str = Field(pattern=NAME_PATTERN)
    sequence: int = Field(ge=0, le=2**63 - 1)
    # Finite only: `Infinity` would make a message that never goes stale, a replay that never ages out.
    sent_at: float = Field(ge=0, allow_inf_nan=False)
    ttl: float = Field(default=DEFAULT_TTL, gt=0, le=3600)
    workspace: str = Field(default="default", pattern=NAME_PATTERN)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    service: ToolServiceDescriptor | None = None
    tools: list[ToolDescriptor] | None = Field(default=None, max_length=MAX_TOOLS_PER_SERVICE)
    version: str = Field(default="", max_length=MAX_VERSION)
    signature: str | None = Field(default=None, max_length=512)

    @model_validator(mode="after")
    def _check(self) -> "Announcement":
        if self.kind == "announce":
            if self.service is None or self.tools is None:
                raise ValueError("an announce needs 'service' and 'tools'")
            for tool in self.tools:
                if tool.service != self.service.id:
                    raise ValueError(f"tool {tool.name!r} names service {tool.service!r}, not {self.service.id!r}")
                check_tool_against_service(tool, self.service)
            names = [t.name for t in self.tools]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"tool announced twice: {', '.join(dupes)}")
            if descriptor_digest(self.service, self.tools) != self.digest:
                raise ValueError("digest does not match service + tools")
        return self


class Probe(WireModel):
    """Ask live services to re-announce; `instance` narrows it to one.

    With `refused` set it is no request to re-announce but a notice to
    `instance`: the registry refused something it sent (a conflict, an
    untrusted signature, ...) and says why, so the service can log it.
    """

    instance: str | None = Field(default=None, pattern=NAME_PATTERN)
    reason: str = Field(default="", max_length=200)
    refused: str | None = Field(default=None, max_length=1000)

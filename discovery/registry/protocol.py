"""The registry's query API (DESIGN section 6): what `toolreg tools`, `conflicts`, `rejections`, `release`,
`pending`, `approve` and `reject` ask and get.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    Field,
)

from toolservice_base.schemas import (
    MAX_PAGE_ITEMS,
    NAME_PATTERN,
    ErrorBody,
    canonical_json,
)

from .usage import ToolUsage

# --- registry query API (spec section 6) -----------------------------------

RegistryOperation = Literal["list", "get", "rejections", "conflicts", "release", "pending", "approve", "reject"]

DIGEST_PATTERN = r"^[0-9a-f]{8,64}$"
"""A definition digest as `toolreg approve --digest` takes it: the whole sha256 in hex, or its first 8 or more
digits."""


class RegistryRequest(BaseModel):
    """A query; `workspace` left out means the registry's own default workspace."""

    operation: RegistryOperation
    name: str | None = Field(default=None, pattern=NAME_PATTERN)
    workspace: str | None = Field(default=None, pattern=NAME_PATTERN)
    limit: int | None = Field(default=None, ge=1, le=MAX_PAGE_ITEMS)
    """`list` only: page the answer (at most `limit` tools and about `PAGE_BYTES`); `more` says whether tools follow."""
    after: str | None = Field(default=None, pattern=NAME_PATTERN)
    """`list` only: tools named after this one (the last name of the previous page)."""
    digest: str | None = Field(default=None, pattern=DIGEST_PATTERN)
    """`approve`, `reject`: the offered definition's digest (or a prefix) the operator decided on; refused if another is
    offered."""
    signature: str | None = Field(default=None, max_length=512)
    """`approve`, `reject`: an operator's signature (`toolreg approve --signing-key`), which a registry whose trust
    policy has `config-writes signed` requires (`discovery.registry.decisions`); older registries ignore it."""

    def signed_part(self) -> bytes:
        """What a signature covers: the request's canonical JSON without the signature."""
        return canonical_json(self.model_dump(mode="json", exclude={"signature"}, exclude_none=True)).encode()


class ToolStatus(BaseModel):
    name: str
    service: str | None = None
    """None when the item names no service (or cannot be read); left out on the wire, like every None."""
    source: Literal["announced", "static"]
    status: str
    instances: int = 0
    last_heartbeat_age: float | None = None
    workspace: str = "default"
    version: str = ""
    detail: str = ""
    """Why the status is not plain `live`/`configured` (refused, held, grace, unavailable), in one line."""
    digest: str | None = None
    """sha256 of the tool's definition as the store holds it (`definition_digest`); None if unknown (its item does not
    parse, or a service restored at start has not re-announced yet)."""
    usage: ToolUsage | None = None
    """Calls/s, errors/s and p95 from its live instances' heartbeats, as the registry page shows them; None: not known
    (static tools, services that send no counters, one heartbeat so far). Left out by older registries, ignored by
    older clients. An agent ranks its search by errors/s over calls/s (`toolreg mcp --search`)."""


class Rejection(BaseModel):
    at: float
    """When the sender was last refused for this reason (wall clock)."""
    reason: str
    instance: str | None = None
    service: str | None = None
    excerpt: str = ""
    count: int = 1
    """Refusals of the same sender for the same reason, aggregated into this entry."""
    first: float | None = None
    """When the first of them was refused."""
    workspace: str | None = None
    """The workspace the refused message named (or the refused service's, for a conflict or a store refusal);
    None when the message was refused before it could be read (malformed, too large), or by an older registry."""


class NameConflict(BaseModel):
    """An announced item refused because another holder has the key.

    `held_by` is `static` (an item the registry does not own) or the id of the
    service that claimed it first; `reason` says which key and why.
    """

    at: float
    tool: str
    service: str
    held_by: str
    workspace: str = "default"
    reason: str = ""


class PendingChange(BaseModel):
    """A definition offered for a pinned tool and held until an operator decides (`toolreg approve`/`reject`)."""

    tool: str
    service: str
    workspace: str
    pinned: str
    """Digest of the pinned definition: what agents see (or nothing, if no instance still offers it)."""
    offered: str
    """Digest of the held definition: what no agent sees until it is approved."""
    diff: str
    """Unified diff from the pinned definition to the offered one, both as indented JSON."""
    signer: str | None = None
    """Who signed the offer: the trust policy's name for the key (its key id if unnamed); None without a policy."""
    version: str = ""
    """The service version that offers it."""
    pinned_version: str = ""
    first_seen: float
    last_seen: float
    """Wall clock: when an instance offering it was first and last heard from."""


class RegistryResponse(BaseModel):
    tools: list[ToolStatus] | None = None
    tool: ToolStatus | None = None
    rejections: list[Rejection] | None = None
    conflicts: list[NameConflict] | None = None
    held: list[str] | None = None
    released: list[str] | None = None
    more: bool | None = None
    pending: list[PendingChange] | None = None
    decided: PendingChange | None = None
    """`approve`, `reject`: the change decided on."""
    applied: bool | None = None
    """`approve`: the approved definition reached the store before the answer (else it is on its way)."""
    pinning: bool | None = None
    """`list`, `pending`: whether this registry pins definitions (`--pin-definitions`)."""
    error: ErrorBody | None = None

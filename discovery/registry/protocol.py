"""The registry's query API (DESIGN section 6): what `toolreg tools`, `conflicts` and `rejections` ask and get.
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
)

# --- registry query API (spec section 6) -----------------------------------

RegistryOperation = Literal["list", "get", "rejections", "conflicts", "release"]


class RegistryRequest(BaseModel):
    """A query; `workspace` left out means the registry's own default workspace."""

    operation: RegistryOperation
    name: str | None = Field(default=None, pattern=NAME_PATTERN)
    workspace: str | None = Field(default=None, pattern=NAME_PATTERN)
    limit: int | None = Field(default=None, ge=1, le=MAX_PAGE_ITEMS)
    """`list` only: page the answer (at most `limit` tools and about `PAGE_BYTES`); `more` says whether tools follow."""
    after: str | None = Field(default=None, pattern=NAME_PATTERN)
    """`list` only: tools named after this one (the last name of the previous page)."""


class ToolStatus(BaseModel):
    name: str
    service: str | None
    source: Literal["announced", "static"]
    status: str
    instances: int = 0
    last_heartbeat_age: float | None = None
    workspace: str = "default"
    version: str = ""
    detail: str = ""
    """Why the status is not plain `live`/`configured` (refused, held, grace, unavailable), in one line."""


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


class RegistryResponse(BaseModel):
    tools: list[ToolStatus] | None = None
    tool: ToolStatus | None = None
    rejections: list[Rejection] | None = None
    conflicts: list[NameConflict] | None = None
    held: list[str] | None = None
    released: list[str] | None = None
    more: bool | None = None
    error: ErrorBody | None = None

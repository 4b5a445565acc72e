"""The config store's messages (DESIGN section 5), TrustGraph 2.11's config protocol on the wire."""

from __future__ import annotations

import json
from typing import Any

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
)

from .base import (
    MAX_PAGE_ITEMS,
    canonical_json,
    describe_validation_error,
)
from .calls import ErrorBody
from .tools import ToolDescriptor, ToolServiceDescriptor

# --- config store (spec section 5) -----------------------------------------
#
# The config messages are TrustGraph 2.11's (`trustgraph/schema/config.py`):
# its processors, agent and API gateway talk to our store unchanged. So every
# field has TrustGraph's default, unknown fields are ignored (its deserializer
# drops them), and what the store sends is `to_trustgraph()`: every field
# present, `null` only where TrustGraph writes `null`.

CONFIG_OPERATIONS = ("get", "put", "delete", "list", "getvalues", "config", "getvalues-all-ws", "getkeys-all-ws")
WORKSPACE_OPERATIONS = ("get", "put", "delete", "list", "getvalues", "config")
"""Operations scoped to one workspace; the other two span all workspaces."""
RESERVED_WORKSPACE_PREFIX = "_"
"""TrustGraph's reserved workspaces (`__template__`, `__workspaces__`): stored, never announced in pushes."""


CONFIG_TYPE_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
"""Item types: names, plus `:` for TrustGraph's `processor:<id>` (each flow processor's own config type)."""


def is_reserved_workspace(workspace: str) -> bool:
    return workspace.startswith(RESERVED_WORKSPACE_PREFIX)


class ConfigKey(BaseModel):
    type: str = Field(pattern=CONFIG_TYPE_PATTERN)
    key: str = Field(min_length=1, max_length=512)


class ConfigValue(ConfigKey):
    """An item. `value` is null in TrustGraph's `get` answer for a missing key; `workspace` is set by the
    cross-workspace reads."""

    value: str | None = ""
    workspace: str = ""


class ExpectedValue(ConfigKey):
    """A precondition: the item holds `value`, or is absent when `value` is null."""

    value: str | None = None


class ConfigRequest(BaseModel):
    """A config-store call, as TrustGraph writes it or as our client does.

    `operation` is checked by the store, not here, so an unknown one gets
    TrustGraph's `bad-operation` answer. `workspace` left out means
    `default` (our clients); TrustGraph always sends it, empty on the
    cross-workspace operations. Beyond TrustGraph's fields, a `put` may carry
    `keys` to delete in the same transaction and `expect` preconditions
    (compare-and-set); a writer that sends neither gets TrustGraph's behaviour.

    `list` and `getvalues` are paged when `limit` or `after` is set: at most
    `limit` items (and about `PAGE_BYTES`), keys after `after`, in key order,
    with `more` in the answer. A reader that sends neither (TrustGraph) gets
    the whole answer in one message, as before.
    """

    @property
    def paged(self) -> bool:
        return self.limit is not None or self.after is not None

    operation: str = Field(default="", max_length=64)
    workspace: str = Field(default="default", pattern=r"^([A-Za-z0-9_.-]{1,128})?$")
    keys: list[ConfigKey] = Field(default_factory=list)
    values: list[ConfigValue] = Field(default_factory=list)
    type: str | None = Field(default=None, pattern=CONFIG_TYPE_PATTERN)
    expect: list[ExpectedValue] = Field(default_factory=list)
    limit: int | None = Field(default=None, ge=1, le=MAX_PAGE_ITEMS)
    after: str | None = Field(default=None, max_length=512)
    signature: str | None = Field(default=None, max_length=512)
    """Beyond TrustGraph's fields: who vouches for a write (`toolservice_base.signing.sign_config_request`), for a
    store whose trust policy covers the config queue; TrustGraph's store ignores it."""

    def signed_part(self) -> bytes:
        """What a signature covers: the request's canonical JSON without the signature."""
        return canonical_json(self.model_dump(mode="json", exclude={"signature"}, exclude_none=True)).encode()

    @field_validator("type", mode="before")
    @classmethod
    def _empty_type(cls, value: Any) -> Any:
        return None if value == "" else value


class ConfigResponse(BaseModel):
    version: int = 0
    values: list[ConfigValue] = Field(default_factory=list)
    directory: list[str] = Field(default_factory=list)
    config: dict[str, dict[str, str]] = Field(default_factory=dict)
    error: ErrorBody | None = None
    more: bool | None = None
    """Paged answers only: whether items follow the last key of this page (never sent to a reader that did not page)."""

    def to_trustgraph(self) -> dict[str, Any]:
        """Every field, as TrustGraph's JSON serializer writes a `ConfigResponse` (`error` null when none), plus `more`
        on a page."""
        return self.model_dump(mode="json", exclude={"more"} if self.more is None else None)


class WorkspaceChanges(BaseModel):
    created: list[str] = Field(default_factory=list)
    deleted: list[str] = Field(default_factory=list)


class ConfigPush(BaseModel):
    """Sent after every change: which types changed in which workspaces, and which workspaces came or went.

    Empty `changes` is TrustGraph's "everything may have changed" poke, sent
    when a store starts.
    """

    version: int = 0
    changes: dict[str, list[str]] = Field(default_factory=dict)
    workspace_changes: WorkspaceChanges | None = None

    def to_trustgraph(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def validate_config_item(item_type: str, key: str, value: str) -> ToolDescriptor | ToolServiceDescriptor | None:
    """Parse a `tool` or `tool-service` item; other types are opaque text.

    Raises ValueError naming the offending field, and checks that the key is
    the descriptor's own name so `tool/a` can never hold tool `b`.
    """
    model: type[ToolDescriptor] | type[ToolServiceDescriptor]
    if item_type == "tool":
        model = ToolDescriptor
    elif item_type == "tool-service":
        model = ToolServiceDescriptor
    else:
        return None
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{item_type}/{key}: value is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{item_type}/{key}: value must be a JSON object")
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{item_type}/{key}: {describe_validation_error(exc)}") from None
    own = parsed.name if isinstance(parsed, ToolDescriptor) else parsed.id
    if own != key:
        field = "name" if item_type == "tool" else "id"
        raise ValueError(f"{item_type}/{key}: field '{field}' is {own!r} but the key is {key!r}; they must match")
    return parsed

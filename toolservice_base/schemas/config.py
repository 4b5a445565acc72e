"""The config store's messages (DESIGN section 5), TrustGraph 2.11's config protocol on the wire."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
)

from .base import (
    MAX_PAGE_ITEMS,
    MAX_PUSH_BYTES,
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

CHANGES_OPERATION = "changes"
"""Beyond TrustGraph's operations: what changed in a workspace since a version (`ConfigRequest.since`)."""
CONFIG_OPERATIONS = (
    "get",
    "put",
    "delete",
    "list",
    "getvalues",
    "config",
    "getvalues-all-ws",
    "getkeys-all-ws",
    CHANGES_OPERATION,
)
WORKSPACE_OPERATIONS = ("get", "put", "delete", "list", "getvalues", "config", CHANGES_OPERATION)
"""Operations scoped to one workspace; the other two span all workspaces."""
RESERVED_WORKSPACE_PREFIX = "_"
"""TrustGraph's reserved workspaces (`__template__`, `__workspaces__`): stored, never announced in pushes."""


CONFIG_TYPE_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
"""Item types: names, plus `:` for TrustGraph's `processor:<id>` (each flow processor's own config type)."""
ItemType = Annotated[str, Field(pattern=CONFIG_TYPE_PATTERN)]
CHANGES_TOO_OLD = "too-old"
"""The error type of a `changes` answer the store's feed cannot give (the version is past its window): read
everything."""


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
    the whole answer in one message, which is all its protocol can read.

    `changes` (ours alone; TrustGraph's store and an older one answer
    `bad-operation`) names every key of the workspace changed after version
    `since`, of `types` (none: every type), with its value now, null for a
    key deleted since; paged like `getvalues`, `after` being `<type>/<key>`.
    Past the store's window it is answered with the error `too-old`: read
    everything.
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
    after: str | None = Field(default=None, max_length=641)
    since: int | None = Field(default=None, ge=0)
    types: list[ItemType] | None = Field(default=None, max_length=64)
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


PUSH_KEYS_PROPERTY = "changed-keys"
"""The push message's property naming the keys a write changed (`ConfigPush.keys`); TrustGraph reads only the body."""
MAX_PUSH_KEYS = 256
"""Keys a push names at most; a write that changed more sends none, and its readers ask the store."""

ChangedKey = tuple[str, str, str, bool]
"""`(workspace, type, key, deleted)`: one key a write changed."""


class ConfigPush(BaseModel):
    """Sent after every change: which types changed in which workspaces, and which workspaces came or went.

    Empty `changes` is TrustGraph's "everything may have changed" poke, sent
    when a store starts. `keys` names the very keys the write changed, when
    they are few: it travels in the message's `changed-keys` property, never
    in the body, so TrustGraph's processors get exactly TrustGraph's push.
    """

    version: int = 0
    changes: dict[str, list[str]] = Field(default_factory=dict)
    workspace_changes: WorkspaceChanges | None = None
    keys: list[ChangedKey] | None = Field(default=None, exclude=True)

    def to_trustgraph(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def properties(self) -> dict[str, str] | None:
        """The message properties the push is sent with: the keys it names, if any."""
        if self.keys is None or len(self.keys) > MAX_PUSH_KEYS:
            return None
        return {PUSH_KEYS_PROPERTY: json.dumps(self.keys, separators=(",", ":"))}

    def with_keys(self, properties: dict[str, str]) -> "ConfigPush":
        """This push with the keys its message's properties name (left None if they name none, or nonsense)."""
        text = properties.get(PUSH_KEYS_PROPERTY)
        if text is None or len(text) > MAX_PUSH_BYTES:
            return self
        try:
            rows = json.loads(text)
            keys = [(str(w), str(t), str(k), bool(d)) for w, t, k, d in rows][:MAX_PUSH_KEYS]
        except (ValueError, TypeError):
            return self
        return self.model_copy(update={"keys": keys})


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

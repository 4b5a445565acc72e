"""Every wire model of the product, in one module.

Descriptors keep the spec's hyphenated JSON keys (`request-queue`,
`config-params`, `sent-at`) as aliases, so what travels and what an operator
writes by hand are the same documents. Python code uses the snake_case names.
Limits live here too: a model that parsed is a model that is safe to store.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
QUEUE_PATTERN = re.compile(
    r"^(persistent|non-persistent)://([A-Za-z0-9_.-]{1,128})/([A-Za-z0-9_.-]{1,128})/([A-Za-z0-9_.-]{1,200})$"
)
NAMESPACE_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,128}/[A-Za-z0-9_.-]{1,128}$")
ARGUMENT_TYPES = ("string", "number", "integer", "boolean", "object", "array")

MAX_MESSAGE_BYTES = 64 * 1024
MAX_DESCRIPTION = 4096
MAX_ARGUMENTS = 64
MAX_CONFIG_PARAMS = 64
MAX_TOOLS_PER_SERVICE = 256
MAX_CONFIG_VALUE_BYTES = 4096
MAX_VERSION = 64
# What each consumer reads at most before it parses anything: the bound on the
# memory and CPU one message from anyone on the broker can cost it.
MAX_REQUEST_BYTES = 1024 * 1024
"""A tool-service request (user, config and arguments as JSON text)."""
MAX_CONFIG_REQUEST_BYTES = 4 * 1024 * 1024
"""A config-store request: a registry batch or a hand-written item; under pulsar-lite's ~5 MiB message limit."""
MAX_ITEM_BYTES = MAX_CONFIG_REQUEST_BYTES - 16 * 1024
"""One config value, measured as the JSON string the store answers with (non-ASCII escaped).

A `put` of one such item fits in one request, and any accepted item fits in one answer page
(`PAGE_BYTES` or one item, whichever is larger), so no read ever needs a message the broker refuses."""
PAGE_BYTES = 1024 * 1024
"""What a paged config or registry answer holds at most, unless a single item is larger."""
MAX_PAGE_ITEMS = 100_000
MAX_QUERY_BYTES = 4 * 1024
"""A registry query (`{"operation": ..., "name": ..., "workspace": ...}`)."""
MAX_PUSH_BYTES = 256 * 1024
"""A config push (`{version, changes: {type: [workspace]}}`)."""
DEFAULT_TTL = 15.0

Name = str


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class WireModel(BaseModel):
    """Base of the hyphenated-key documents."""

    model_config = ConfigDict(alias_generator=_kebab, populate_by_name=True, frozen=True)

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def to_json(self) -> str:
        return canonical_json(self.to_wire())


def canonical_json(value: Any) -> str:
    """One byte-exact rendering per value: sorted keys, no spaces, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def check_name(value: str, what: str = "name") -> str:
    if not isinstance(value, str) or not re.match(NAME_PATTERN, value):
        raise ValueError(f"{what} {value!r} must match {NAME_PATTERN}")
    return value


def check_queue(value: str) -> str:
    if not QUEUE_PATTERN.match(value):
        raise ValueError(
            f"queue {value!r} must look like persistent://tenant/namespace/topic or non-persistent://tenant/namespace/topic"
        )
    return value


def check_namespace(value: str) -> str:
    """A `tenant/namespace` pair, as allowed queue namespaces are written."""
    if not isinstance(value, str) or not NAMESPACE_PATTERN.match(value):
        raise ValueError(f"namespace {value!r} must look like tenant/namespace, e.g. tg/request")
    return value


def queue_namespace(queue: str) -> str:
    """`tenant/namespace` of a queue URI already checked by `check_queue`."""
    match = QUEUE_PATTERN.match(queue)
    if match is None:
        raise ValueError(f"not a queue URI: {queue!r}")
    return f"{match.group(2)}/{match.group(3)}"


# --- tool-service protocol (spec section 3) --------------------------------


class ConfigParam(WireModel):
    model_config = ConfigDict(alias_generator=_kebab, populate_by_name=True, frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    required: bool = False


class ToolServiceDescriptor(WireModel):
    """`tool-service/<id>`: where a service listens and which config it takes."""

    model_config = ConfigDict(alias_generator=_kebab, populate_by_name=True, frozen=True, extra="forbid")

    id: str = Field(pattern=NAME_PATTERN)
    request_queue: str
    response_queue: str
    config_params: list[ConfigParam] = Field(default_factory=list, max_length=MAX_CONFIG_PARAMS)

    @field_validator("request_queue", "response_queue")
    @classmethod
    def _queue(cls, value: str) -> str:
        return check_queue(value)

    @field_validator("config_params")
    @classmethod
    def _unique_params(cls, value: list[ConfigParam]) -> list[ConfigParam]:
        names = [p.name for p in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"config param named twice: {', '.join(dupes)}")
        return value


class Argument(WireModel):
    model_config = ConfigDict(alias_generator=_kebab, populate_by_name=True, frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    type: Literal["string", "number", "integer", "boolean", "object", "array"]
    description: str = Field(max_length=MAX_DESCRIPTION)


class ToolDescriptor(WireModel):
    """`tool/<name>`: what the LLM sees, plus values for the service's config params.

    Keys other than the fixed ones are config values; pydantic keeps them as
    extra fields so a descriptor round-trips unchanged.
    """

    model_config = ConfigDict(alias_generator=_kebab, populate_by_name=True, frozen=True, extra="allow")

    type: str = Field(default="tool-service", pattern=NAME_PATTERN)
    name: str = Field(pattern=NAME_PATTERN)
    description: str = Field(max_length=MAX_DESCRIPTION)
    service: str | None = Field(default=None, pattern=NAME_PATTERN)
    arguments: list[Argument] = Field(default_factory=list, max_length=MAX_ARGUMENTS)

    @model_validator(mode="after")
    def _check(self) -> "ToolDescriptor":
        if self.type == "tool-service" and not self.service:
            raise ValueError("a tool of type 'tool-service' needs 'service'")
        names = [a.name for a in self.arguments]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"argument named twice: {', '.join(dupes)}")
        for key, value in self.config_values.items():
            check_name(key, "config key")
            if len(canonical_json(value).encode()) > MAX_CONFIG_VALUE_BYTES:
                raise ValueError(f"config value {key!r} is larger than {MAX_CONFIG_VALUE_BYTES} bytes")
        return self

    @property
    def config_values(self) -> dict[str, Any]:
        return dict(self.__pydantic_extra__ or {})


def check_tool_against_service(tool: ToolDescriptor, service: ToolServiceDescriptor) -> None:
    """Raise ValueError unless `tool`'s config values fit `service`'s params."""
    params = {p.name: p for p in service.config_params}
    values = tool.config_values
    unknown = sorted(set(values) - set(params))
    if unknown:
        known = ", ".join(sorted(params)) or "none"
        raise ValueError(
            f"tool {tool.name!r}: {', '.join(unknown)} is not a config param of service {service.id!r} (params: {known})"
        )
    missing = sorted(name for name, p in params.items() if p.required and name not in values)
    if missing:
        raise ValueError(f"tool {tool.name!r}: required config param {', '.join(missing)} of service {service.id!r} is missing")


class Error(BaseModel):
    type: str
    message: str


class ToolServiceRequest(BaseModel):
    """What the agent sends; `config` and `arguments` are JSON text, per the spec."""

    user: str = ""
    config: str = "{}"
    arguments: str = "{}"


class ToolServiceResponse(BaseModel):
    error: Error | None = None
    response: str = ""
    end_of_stream: bool = True


def is_last_response(body: dict[str, Any]) -> bool:
    """A response ends its call when it says `end_of_stream`, or carries an error."""
    return bool(body.get("end_of_stream", True)) or bool(body.get("error"))


def response_chunk(body: dict[str, Any], service: str) -> str:
    """The text one response adds to the observation; `ToolError` if the service answered with an error."""
    from .errors import ToolError

    try:
        response = ToolServiceResponse.model_validate(body)
    except ValidationError as exc:
        raise ToolError("bad-response", describe_validation_error(exc), service=service) from None
    if response.error is not None:
        raise ToolError(response.error.type, response.error.message, service=service)
    return response.response


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
    """An item. `value` is null in TrustGraph's `get` answer for a missing key; `workspace` is set by the cross-workspace reads."""

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

    @field_validator("type", mode="before")
    @classmethod
    def _empty_type(cls, value: Any) -> Any:
        return None if value == "" else value


class ConfigResponse(BaseModel):
    version: int = 0
    values: list[ConfigValue] = Field(default_factory=list)
    directory: list[str] = Field(default_factory=list)
    config: dict[str, dict[str, str]] = Field(default_factory=dict)
    error: Error | None = None
    more: bool | None = None
    """Paged answers only: whether items follow the last key of this page (never sent to a reader that did not page)."""

    def to_trustgraph(self) -> dict[str, Any]:
        """Every field, as TrustGraph's JSON serializer writes a `ConfigResponse` (`error` null when none), plus `more` on a page."""
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
        raise ValueError(f"{item_type}/{key}: value is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
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


def printable(text: str, limit: int = 200) -> str:
    """`text` safe for a one-line log or reason: control characters escaped, length capped.

    Field names in an error come from the sender (an unknown key is reported
    by name), so a key holding a newline must not forge a second log line.
    """
    escaped = text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= limit else escaped[:limit] + "…"


def describe_validation_error(exc: ValidationError) -> str:
    """pydantic's errors as one line: `field: message; field: message`."""
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        where = ".".join(printable(str(p), 40) for p in err["loc"]) or "value"
        parts.append(f"{where}: {printable(err['msg'])}")
    more = len(exc.errors()) - 5
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


# --- self-announcement (spec section 4) ------------------------------------

AnnouncementKind = Literal["announce", "heartbeat", "withdraw"]


def descriptor_digest(service: ToolServiceDescriptor, tools: list[ToolDescriptor]) -> str:
    """sha256 of the canonical JSON of service + tools: the same offer, the same digest."""
    body = {"service": service.to_wire(), "tools": sorted((t.to_wire() for t in tools), key=lambda t: t["name"])}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


class Announcement(WireModel):
    model_config = ConfigDict(alias_generator=_kebab, populate_by_name=True, frozen=True, extra="forbid")

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


class Conflict(BaseModel):
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
    conflicts: list[Conflict] | None = None
    held: list[str] | None = None
    released: list[str] | None = None
    more: bool | None = None
    error: Error | None = None

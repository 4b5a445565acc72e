"""What every wire model shares: the name and queue rules, the size limits, canonical JSON.

Descriptors keep the spec's hyphenated JSON keys (`request-queue`,
`config-params`, `sent-at`) as aliases, so what travels and what an operator
writes by hand are the same documents. Python code uses the snake_case names.
Limits live here too: a model that parsed is a model that is safe to store.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
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


def kebab(name: str) -> str:
    return name.replace("_", "-")


class WireModel(BaseModel):
    """Base of the hyphenated-key documents."""

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, frozen=True)

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


def printable(text: str, limit: int = 200) -> str:
    """`text` safe for a one-line log or reason: control characters escaped, length capped.

    Field names in an error come from the sender (an unknown key is reported
    by name), so a key holding a newline must not forge a second log line.
    """
    escaped = text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= limit else escaped[:limit] + "…"


_JSON_WORDS = {"None": "null", "True": "true", "False": "false"}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUOTE_AFTER = frozenset(" \t([{,:")
"""A quote opens a Python string literal only at the start or after one of these (not the apostrophe of "tool's")."""


def json_literals(text: str) -> str:
    """`text` (a validation message, which quotes values as Python reprs) with `None`/`True`/`False` spelled
    `null`/`true`/`false`.

    A tool's arguments come as JSON, from a model or a person: `{"start": null}` is refused as
    `null is not of type 'integer'`, in the language it was written in, not `None ...`. Words inside
    quoted strings (`'None'` is the string that was sent) are left as they are. Applying it twice
    changes nothing more, so a message may pass through more than one layer that spells it.
    """
    out: list[str] = []
    i, end = 0, len(text)
    while i < end:
        char = text[i]
        if char in "'\"" and (i == 0 or text[i - 1] in _QUOTE_AFTER):
            j = i + 1
            while j < end and text[j] != char:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
            continue
        word = _WORD.match(text, i)
        if word is not None:
            out.append(_JSON_WORDS.get(word.group(), word.group()))
            i = word.end()
            continue
        out.append(char)
        i += 1
    return "".join(out)


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

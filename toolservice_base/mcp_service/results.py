"""A `tools/call` result read past the SDK's session, held to what the session holds it to: the negotiated revision.

The session's `send_request` checks a result against the schema of the
revision the connection negotiated, floors a negative `ttlMs`, and drops the
keys only a later revision declares (outside the negotiated contract, a later
revision's constraints would apply to them). The direct path (`direct`)
does the same, once per revision worked out (`RevisionResults.of`), and says
in one line where a result breaks the schema.
"""

from __future__ import annotations

import functools
from types import UnionType
from typing import Any, cast, get_args

from mcp_types import methods
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS
from pydantic import BaseModel, TypeAdapter, ValidationError

from ..schemas import printable

METHOD = "tools/call"
FALLBACK_REVISION = "2025-11-25"
"""The revision a connection that names none is checked by, as the session's result check assumes."""


class RevisionResults:
    """The rules of `tools/call` results under one negotiated revision."""

    __slots__ = ("version", "_validate", "_foreign")

    def __init__(self, version: str | None) -> None:
        self.version = version
        row = methods.SERVER_RESULTS.get((METHOD, version or FALLBACK_REVISION))
        # `methods.validate_server_result` validates, then builds a dump of the result it drops (4 % of the
        # sidecar's loop thread at 32 calls in flight): the same schema's validation alone. None: no schema, as
        # that function's KeyError means.
        self._validate = None if row is None else TypeAdapter(cast(Any, row)).validate_python
        self._foreign = _later_revision_fields(version)

    @classmethod
    @functools.cache
    def of(cls, version: str | None) -> RevisionResults:
        return cls(version)

    def checked(self, raw: dict[str, Any]) -> dict[str, Any]:
        """`raw` as the session would hand it on; pydantic's `ValidationError` if it breaks the revision's schema
        (`outside_schema` says it in one line)."""
        ttl = raw.get("ttlMs")
        if isinstance(ttl, int | float) and not isinstance(ttl, bool) and ttl < 0:
            raw["ttlMs"] = 0
        if self._validate is not None:
            self._validate(raw, by_name=False)
        if not self._foreign.isdisjoint(raw):
            raw = {key: value for key, value in raw.items() if key not in self._foreign}
        return raw

    def outside_schema(self, name: str, error: ValidationError) -> str:
        """One line naming where a result of tool `name` breaks MCP's schema, as pydantic found it first."""
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "the result"
        return (
            f"tool {name!r} of the MCP server answered a result MCP {self.version or ''} does not allow: "
            f"{printable(where, 80)}: {printable(first['msg'], 160)}"
        )


def _later_revision_fields(version: str | None) -> frozenset[str]:
    """Result keys of `tools/call` that a revision later than `version` declares and `version` does not."""
    current = methods.SERVER_RESULTS.get((METHOD, version or ""))
    if current is None or version not in KNOWN_PROTOCOL_VERSIONS:
        return frozenset()
    later: set[str] = set()
    for revision in KNOWN_PROTOCOL_VERSIONS[KNOWN_PROTOCOL_VERSIONS.index(version) + 1 :]:
        row = methods.SERVER_RESULTS.get((METHOD, revision))
        if row is not None:
            later |= _wire_fields(row)
    return frozenset(later - _wire_fields(current))


def _wire_fields(target: type[BaseModel] | UnionType) -> set[str]:
    """Top-level wire keys `target` declares (its members', for a union)."""
    members: tuple[Any, ...] = get_args(target) if isinstance(target, UnionType) else (target,)
    return {
        info.alias or name
        for model in members
        if isinstance(model, type) and issubclass(model, BaseModel)
        for name, info in model.model_fields.items()
    }

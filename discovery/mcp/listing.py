"""What tools/list shows: a workspace's tools filtered (`ToolFilter`), named for MCP, sorted and paged (`Listing`).

A listing follows the `ToolSet`'s changes by what changed (`Listing.updated`): a change of one tool costs one tool,
whatever the set's size, except where a name OpenAI would refuse is involved (its MCP name depends on the whole set).
Pages are cut by name, not position, so a tool added or removed between two pages shifts nothing.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from agent_bridge import ToolSet
from toolservice_base.names import OPENAI_NAME, openai_names

from .auth.policy import Rights

_CURSOR_PREFIX = "after:"
DIGEST_META = "toolreg/definition-digest"
"""The `_meta` key of each listed tool holding the sha256 of its definition (`ToolSet.describe()`'s `digest`), as
`toolreg tools` shows it and the registry pins it (`--pin-definitions`): a client can check it has the approved one."""


@dataclass(frozen=True)
class ToolFilter:
    """`--tools` / `--exclude`: shell patterns matched against a tool's own name and its MCP name."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def admits(self, *names: str) -> bool:
        def hit(patterns: tuple[str, ...]) -> bool:
            return any(fnmatch.fnmatchcase(name, pattern) for name in names for pattern in patterns)

        return (not self.include or hit(self.include)) and not hit(self.exclude)


@dataclass
class Listing:
    """What tools/list shows at one moment: the filtered tools, sorted by MCP name."""

    tools: list[types.Tool]
    own_names: dict[str, str]  # MCP name -> the tool's name in the ToolSet
    _by_name: dict[str, types.Tool] = field(default_factory=dict)
    _names: list[str] = field(default_factory=list)
    _identity: bool = True
    """Every tool's MCP name is its own (what lets `updated` follow a change without the whole set)."""

    def __post_init__(self) -> None:
        self._by_name = {t.name: t for t in self.tools}
        self._names = [t.name for t in self.tools]
        self._identity = all(mcp == own for mcp, own in self.own_names.items())

    @classmethod
    def of(cls, tools: ToolSet, which: ToolFilter) -> Listing:
        mcp_names = openai_names(tools.names())  # the mapping `ToolSet.invoke` resolves, shared with as_openai_tools
        chosen = [
            (mcp_names[spec["name"]], spec)
            for spec in tools.describe()
            if which.admits(spec["name"], mcp_names[spec["name"]])
        ]
        chosen.sort(key=lambda pair: pair[0])
        return cls(tools=[_mcp_tool(name, spec) for name, spec in chosen], own_names={n: s["name"] for n, s in chosen})

    def updated(self, tools: ToolSet, which: ToolFilter, touched: Sequence[str]) -> tuple[Listing, bool] | None:
        """This listing with the `touched` tools (added, removed or changed in `tools`) listed as they are now, and
        whether what it shows changed; its cost follows the change, not the set's size. None when a name OpenAI
        would refuse is involved: such a tool's MCP name depends on the whole set's (`openai_names`), so `of` is."""
        if not self._identity or not all(OPENAI_NAME.match(name) for name in touched):
            return None
        by_name, names, own = dict(self._by_name), list(self._names), dict(self.own_names)
        shown = False
        now = {spec["name"]: spec for spec in tools.describe(touched)}
        for name in touched:
            spec = now.get(name)
            old = by_name.pop(name, None)
            if old is not None:
                del names[bisect.bisect_left(names, name)]
                own.pop(name)
            new = _mcp_tool(name, spec) if spec is not None and which.admits(name, name) else None
            if new is not None:
                by_name[name] = new
                bisect.insort(names, name)
                own[name] = name
            shown = shown or (old is None) != (new is None) or (old is not None and old != new)
        return Listing(tools=[by_name[n] for n in names], own_names=own), shown

    def same_as(self, other: Listing) -> bool:
        return [t.model_dump() for t in self.tools] == [t.model_dump() for t in other.tools]

    def tool(self, name: str) -> types.Tool | None:
        return self._by_name.get(name)

    def by_name(self) -> dict[str, types.Tool]:
        """MCP name -> tool."""
        return self._by_name

    def visible_to(self, rights: Rights) -> Listing:
        """The tools `rights` may call, and only those."""
        if rights.everything:
            return self
        chosen = [t for t in self.tools if rights.allows(self.own_names[t.name], t.name)]
        return Listing(tools=chosen, own_names={t.name: self.own_names[t.name] for t in chosen})

    def page(self, cursor: str | None, size: int) -> types.ListToolsResult:
        start = 0 if cursor is None else self._start_after(cursor)
        page = self.tools[start : start + size]
        more = start + size < len(self.tools)
        return types.ListToolsResult(tools=page, next_cursor=_cursor_after(page[-1].name) if more and page else None)

    def _start_after(self, cursor: str) -> int:
        try:
            decoded = base64.urlsafe_b64decode(cursor.encode("ascii")).decode("utf-8")
        except (binascii.Error, UnicodeError, ValueError):
            decoded = ""
        if not decoded.startswith(_CURSOR_PREFIX):
            raise MCPError(
                types.INVALID_PARAMS,
                "invalid cursor: pass back a nextCursor from tools/list, or list again without one",
            )
        after = decoded.removeprefix(_CURSOR_PREFIX)
        # By name, not by position: a tool added or removed between two pages shifts nothing.
        return bisect.bisect_right(self._names, after)


def _mcp_tool(name: str, spec: Mapping[str, Any]) -> types.Tool:
    """One tool as tools/list shows it: its schemas as its service declared them, its title and MCP's hints."""
    annotations = spec.get("annotations")
    return types.Tool(
        name=name,
        title=spec.get("title"),
        description=spec["description"],
        input_schema=spec["parameters"],
        output_schema=spec.get("output_schema"),
        annotations=types.ToolAnnotations.model_validate(annotations) if annotations is not None else None,
        _meta={DIGEST_META: spec["digest"]},
    )


def mcp_names_of(listing: Listing) -> dict[str, str]:
    """A tool's own name -> its MCP name, in `listing`."""
    return {own: mcp for mcp, own in listing.own_names.items()}


def _cursor_after(name: str) -> str:
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{name}".encode()).decode("ascii")

"""What an MCP server lists, as one tool service's descriptors: names mapped, limits checked, all or nothing.

An MCP tool name that is also a tool name here (`[A-Za-z0-9_.-]`, 1 to 128
characters: what MCP's own naming guidance allows) is kept as it is. Any
other is mapped: a character that looks like one of that set (UTS #39
confusables: a Cyrillic `е`, the hyphen U+2010) becomes the one it looks like,
so a lookalike of a name is announced as that name (and refused where another
service has it); each other character outside the set becomes `_`; and a name
longer than 128 characters is cut and ends in a short hash of the whole
(`github/create issue` is announced as `github_create_issue`; calls to it
reach the server under its own name). A renamed tool without a title gets its
MCP name as its title, so people still see what the server calls it. Two
tools that map to one name, or one that maps to a name already taken, are
refused.

A listing is announced whole or not at all: a tool whose schema is over the
limits, a service over the announcement's size, more tools than one service may
offer: each is one `McpServerError` line naming the tool or the limit and what
to do (leave tools out with `include`/`exclude`, or split the server across
several sidecars). A description longer than the limit is cut (it is prose),
and the cut is logged.

Only plain JSON goes in and out: the MCP SDK is not imported here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..declaration import build_descriptors
from ..errors import McpServerError, ServiceDefinitionError
from ..logs import get_logger
from ..names import ascii_lookalikes
from ..schemas import ToolDescriptor, ToolServiceDescriptor, describe_validation_error
from ..schemas.base import MAX_DESCRIPTION, MAX_MESSAGE_BYTES, MAX_TOOLS_PER_SERVICE, NAME_PATTERN
from ..topics import Topics

log = get_logger("toolservice_base.mcp_service")

MAX_NAME = 128
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_NOT_SERVICE = re.compile(r"[^a-z0-9_.-]+")
MAX_SERVICE_ID = 100
"""Service ids derived from a server's name are cut here: instance ids and queue names are built on them."""


def tool_name(mcp_name: str) -> str:
    """The name an MCP tool is announced under: its own when valid here, else mapped (see the module's docstring)."""
    if re.fullmatch(NAME_PATTERN, mcp_name):
        return mcp_name
    mapped = _NOT_NAME.sub("_", ascii_lookalikes(mcp_name)) or "_"
    if len(mapped) > MAX_NAME:
        mapped = f"{mapped[: MAX_NAME - 9]}-{hashlib.sha256(mcp_name.encode()).hexdigest()[:8]}"
    return mapped


def service_id_of(server_name: str | None) -> str:
    """A service id from the server's `serverInfo.name` (`mcp-servers/everything` gives `mcp-servers-everything`);
    McpServerError if it gives none."""
    derived = _NOT_SERVICE.sub("-", (server_name or "").lower()).strip("-.")[:MAX_SERVICE_ID].strip("-.")
    if not derived:
        raise McpServerError(
            f"the MCP server's name ({server_name!r}) gives no service id; name one (--service-id, service_id=)"
        )
    return derived


@dataclass(frozen=True)
class Selection:
    """Which of a server's tools to announce: MCP names matching any `include` pattern (all if none), none matching
    an `exclude` pattern (shell-style: `get-*`)."""

    include: Sequence[str] = ()
    exclude: Sequence[str] = ()

    def admits(self, name: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(name, pattern) for pattern in self.include):
            return False
        return not any(fnmatch.fnmatchcase(name, pattern) for pattern in self.exclude)


@dataclass(frozen=True)
class Offer:
    """One listing, ready to announce: the service, its tools, and the MCP name of each tool by its name here."""

    service: ToolServiceDescriptor
    tools: list[ToolDescriptor]
    mcp_names: Mapping[str, str] = field(default_factory=dict)
    listed: int = 0
    """How many tools the server listed, the ones left out included."""


def _leave_out(name: str) -> str:
    return f"leave it out (--exclude {name!r}, exclude=)"


def _descriptor(tool: Mapping[str, Any], name: str, service_id: str) -> dict[str, Any]:
    mcp_name = str(tool.get("name"))
    description = tool.get("description") or tool.get("title") or mcp_name
    if len(description) > MAX_DESCRIPTION:
        log.warning("mcp.description_cut", tool=mcp_name, length=len(description), limit=MAX_DESCRIPTION)
        description = description[: MAX_DESCRIPTION - 1] + "\u2026"
    renamed = {"title": mcp_name} if name != mcp_name and not tool.get("title") else {}
    try:
        descriptor = ToolDescriptor.from_mcp(
            {**tool, **renamed, "name": name, "description": description}, service=service_id
        )
    except ValidationError as exc:
        raise McpServerError(
            f"tool {mcp_name!r} of the MCP server cannot be announced: {describe_validation_error(exc)}; "
            f"{_leave_out(mcp_name)}"
        ) from None
    return descriptor.to_wire()


def offer_of(
    listed: Sequence[Mapping[str, Any]], service_id: str, topics: Topics, selection: Selection = Selection()
) -> Offer:
    """The tools an MCP server listed (each a `Tool` as JSON), as one service's descriptors; McpServerError for a
    listing that cannot be announced whole."""
    chosen = [tool for tool in listed if isinstance(tool.get("name"), str) and selection.admits(tool["name"])]
    if not chosen:
        raise McpServerError(
            f"the MCP server lists {len(listed)} tools and --only/--exclude choose none of them; nothing to announce"
        )
    if len(chosen) > MAX_TOOLS_PER_SERVICE:
        raise McpServerError(
            f"the MCP server offers {len(chosen)} tools, more than the {MAX_TOOLS_PER_SERVICE} one service may; "
            "announce part of them (--only/--exclude), in several sidecars, each with its own --service-id"
        )
    mcp_names: dict[str, str] = {}
    for tool in chosen:
        name = tool_name(tool["name"])
        if name in mcp_names:
            raise McpServerError(
                f"MCP tools {mcp_names[name]!r} and {tool['name']!r} would both be announced as {name!r} (tool names "
                f"here are [A-Za-z0-9_.-], up to {MAX_NAME} characters); {_leave_out(tool['name'])}"
            )
        if name != tool["name"]:
            log.info("mcp.tool_renamed", tool=tool["name"], announced_as=name)
        mcp_names[name] = tool["name"]
    tools = [_descriptor(tool, tool_name(tool["name"]), service_id) for tool in chosen]
    try:
        service, descriptors = build_descriptors({"id": service_id}, tools, topics)
    except ServiceDefinitionError as exc:
        if "limit" in str(exc):
            raise McpServerError(
                f"the MCP server's {len(chosen)} tools make an announcement larger than the registry's "
                f"{MAX_MESSAGE_BYTES // 1024} KiB limit; announce part of them (--only/--exclude), in several "
                "sidecars, each with its own --service-id"
            ) from None
        raise McpServerError(f"the MCP server's tools cannot be announced: {exc}") from None
    return Offer(service, descriptors, mcp_names, len(listed))

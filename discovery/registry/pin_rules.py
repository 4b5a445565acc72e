"""Pinned definitions as records and pure rules: what a pin and a held change are, and which offer the merge writes.

`pins.PinBook` keeps the pins and held changes of a registry and decides on
them; everything here is a value or a function of values, so each rule is
tested without a registry: `hold` (the offer the merge may write, given the
pins), the version order `auto-approve` uses, the diff `toolreg pending`
shows, and the reasons a sender is told. See `pins` for the whole design.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolservice_base.schemas import (
    ToolAnnotations,
    ToolDescriptor,
    ToolServiceDescriptor,
    canonical_json,
    descriptor_digest,
)
from toolservice_base.schemas.tools import service_definition

from .merge import Offer

PIN_TYPE = "discovery-pin"
"""`discovery-pin/<tool>`, in the tool's workspace."""
PENDING_TYPE = "pending-definition"
"""`pending-definition/<workspace>/<tool>`, in the reserved workspace `_toolreg`."""
MAX_REJECTED = 32
"""Rejected digests kept per tool, newest last: a sender cycling definitions cannot grow a pin without bound."""

PinnedBy = Literal["first-acceptance", "operator", "auto-approve"]
ToolKey = tuple[str, str]
"""(workspace, tool name)."""

_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)$")


class PinError(ValueError):
    """An operator's decision that cannot be taken; `code` is the query API's error type."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Pin(BaseModel):
    """The value of `discovery-pin/<tool>`: the definition agents may see for this tool name."""

    model_config = ConfigDict(frozen=True)

    tool: str
    workspace: str
    service: str
    """The service whose offer was pinned (another service offering the name is held like any change)."""
    digest: str
    definition: dict[str, Any]
    version: str = ""
    signer: str | None = None
    """Key id that signed the pinned offer (under a trust policy): auto-approval needs the same key."""
    at: float
    by: PinnedBy = "first-acceptance"
    rejected: tuple[str, ...] = ()
    """Digests an operator rejected for this tool: announcements offering one are refused."""

    def to_value(self) -> str:
        return canonical_json(self.model_dump(mode="json"))


class Pending(BaseModel):
    """The value of `_toolreg` `pending-definition/<workspace>/<tool>`: a held definition, waiting for an operator."""

    tool: str
    workspace: str
    service: str
    pinned: str
    offered: str
    definition: dict[str, Any]
    version: str = ""
    signer: str | None = None
    first_seen: float
    last_seen: float = Field(default=0.0)

    def to_value(self) -> str:
        return canonical_json(self.model_dump(mode="json"))


@dataclass(frozen=True)
class Candidate:
    """One tool as one offer gives it."""

    offer: Offer
    tool: ToolDescriptor

    @property
    def digest(self) -> str:
        return self.offer.digests[self.tool.name]


@dataclass
class Hold:
    """What `hold` decided for one service."""

    offer: Offer | None
    """The offer to merge: pinned definitions only (the newest offer itself when nothing is held)."""
    admitted: dict[str, Candidate] = field(default_factory=dict)
    """Tool name -> where its merged definition comes from."""
    held: dict[str, Candidate] = field(default_factory=dict)
    """Tool name -> the newest definition a live offer makes that differs from the pin (rejected ones included)."""


def hold(offers: Sequence[Offer], pins: Mapping[str, Pin], taken: Callable[[str], bool] = lambda name: False) -> Hold:
    """The offer to merge for one service, given its live offers (newest first) and the workspace's pins.

    The tool set is the newest offer's (a tool it dropped goes, as without
    pins); each tool's definition is the newest one that matches its pin (or
    any, for a tool with no pin yet), among the offers with the service
    descriptor chosen by `_pinned_service`. `taken(name)`: another service
    owns the name, so the merge refuses it as a conflict anyway and nothing
    is held.
    """
    if not offers:
        return Hold(None)
    newest = offers[0]

    def admissible(offer: Offer, name: str) -> bool:
        pin = pins.get(name)
        return pin is None or taken(name) or pin.digest == offer.digests[name]

    service, base = _pinned_service(
        offers, [pin for tool in newest.tools if (pin := pins.get(tool.name)) is not None and not taken(tool.name)]
    )
    result = Hold(None)
    for tool in newest.tools:
        name = tool.name
        source = next(
            (
                offer
                for offer in offers
                if offer.service == service and offer.tool(name) is not None and admissible(offer, name)
            ),
            None,
        )
        if source is not None:
            found = source.tool(name)
            assert found is not None
            result.admitted[name] = Candidate(source, found)
        offered = next(
            (offer for offer in offers if offer.tool(name) is not None and not admissible(offer, name)), None
        )
        if offered is not None:
            found = offered.tool(name)
            assert found is not None
            result.held[name] = Candidate(offered, found)
    if (
        service == newest.service
        and len(result.admitted) == len(newest.tools)
        and all(c.offer is newest for c in result.admitted.values())
    ):
        result.offer = newest
    else:
        tools = tuple(candidate.tool for candidate in result.admitted.values())
        base = base or newest
        result.offer = Offer(
            service, tools, descriptor_digest(service, list(tools)), base.version, base.signer, base.answer_key
        )
    return result


def _pinned_service(offers: Sequence[Offer], pins: Sequence[Pin]) -> tuple[ToolServiceDescriptor, Offer | None]:
    """The one `tool-service/<id>` item of a service serves all its tools, so it must be a pinned one.

    The newest live offer whose queues and params some pin of the service
    names (the newest offer itself when no tool of it is pinned yet). If no
    live offer has them (the service changed its queues, say), the pinned
    ones are rebuilt from a pin: the item keeps pointing where the approved
    definition said, and the changed tools are held (absent) until decided.
    Returns the descriptor and the offer it comes from (None: from a pin).
    """
    newest = offers[0]
    if not pins:
        return newest.service, newest
    parts = {canonical_json(pin.definition.get("service")) for pin in pins}
    for offer in offers:
        if canonical_json(service_definition(offer.service)) in parts:
            return offer.service, offer
    part = pins[0].definition.get("service") or {}
    try:
        return ToolServiceDescriptor.model_validate({**part, "id": newest.service.id}), None
    except ValidationError:  # a pin from another kind of tool: nothing pinned to keep
        return newest.service, newest


def escalation(pinned: Mapping[str, Any], offered: Mapping[str, Any]) -> str | None:
    """Why an offered definition is riskier than the pinned one by MCP's hints (MCP's defaults where a hint is
    absent), or None. Such a change is never approved automatically."""
    before, after = _hints(pinned), _hints(offered)
    if not before.destructive and after.destructive:
        return "it now says it may destroy something (destructiveHint or readOnlyHint changed)"
    if before.read_only_hint and not after.read_only_hint:
        return "it no longer says it is read-only (readOnlyHint)"
    if not before.open_world and after.open_world:
        return "it now says it may reach outside systems (openWorldHint)"
    return None


def _hints(definition: Mapping[str, Any]) -> ToolAnnotations:
    try:
        return ToolAnnotations.model_validate(definition.get("annotations") or {})
    except ValidationError:
        return ToolAnnotations()


def version_key(version: str) -> tuple[int, ...] | None:
    """`1.10.2` -> (1, 10, 2); None for anything but dotted numbers (such a version is never "higher")."""
    match = _VERSION.match(version.strip())
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def higher(offered: str, pinned: str) -> bool:
    new, old = version_key(offered), version_key(pinned)
    return new is not None and old is not None and new > old


def pretty(definition: Mapping[str, Any]) -> list[str]:
    return json.dumps(definition, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def definition_diff(pinned: Pin, offered: Pending) -> str:
    """A unified diff from the pinned definition to the offered one, as indented JSON."""
    lines = difflib.unified_diff(
        pretty(pinned.definition),
        pretty(offered.definition),
        fromfile=f"pinned {pinned.digest[:12]}",
        tofile=f"offered {offered.offered[:12]}",
        lineterm="",
        n=2,
    )
    return "\n".join(lines)


def rejected_reason(tool: str, offered: str, pinned: str) -> str:
    """What `toolreg rejections` says, and the sender is told, of an offer of a rejected definition."""
    return (
        f"definition rejected: tool {tool!r} offers definition {offered[:12]}, which an operator rejected "
        f"(`toolreg reject`); the pinned definition is {pinned[:12]}"
    )


def pending_key(workspace: str, tool: str) -> str:
    return f"{workspace}/{tool}"


def matches(offered: str, given: str | None) -> bool:
    """`--digest` names the offered definition: the whole digest or a prefix of it (8 digits or more)."""
    return given is None or (len(given) >= 8 and offered.startswith(given.lower()))

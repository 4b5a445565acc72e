"""Pinned definitions and what MCP says of a tool: a changed title, annotation, input or output schema is a
definition change like a changed description; a tool that says none of them keeps the digest it always had; and
auto-approval never passes a change that makes a tool riskier by MCP's hints, however it is signed."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from support.pins import ORIGINAL, offer, service, tool

from discovery.registry.pin_rules import Pin, definition_diff, escalation, hold
from discovery.registry.pins import PinBook
from toolservice_base.schemas import ToolDescriptor, ToolServiceDescriptor, canonical_json
from toolservice_base.schemas.tools import definition_digest, tool_definition

SCHEMA = {
    "type": "object",
    "properties": {"topic": {"type": "string", "description": "The topic"}},
    "required": ["topic"],
}


def described(**fields: Any) -> ToolDescriptor:
    """`tell-joke` with a full input schema (its flat arguments derived) and `fields` beside it."""
    return tool(arguments=(), **{"input-schema": SCHEMA, **fields})


def pin_of(svc: ToolServiceDescriptor, t: ToolDescriptor, **fields: Any) -> Pin:
    return Pin(
        tool=t.name,
        workspace="default",
        service=svc.id,
        digest=definition_digest(t, svc),
        definition=tool_definition(t, svc),
        at=0.0,
        **fields,
    )


CHANGES: dict[str, ToolDescriptor] = {
    "title": described(title="Joke teller"),
    "annotations": described(annotations={"readOnlyHint": True}),
    "input-schema": tool(
        arguments=(), **{"input-schema": {**SCHEMA, "properties": {"topic": {"type": "string", "maxLength": 9}}}}
    ),
    "output-schema": described(**{"output-schema": {"type": "object", "properties": {"joke": {"type": "string"}}}}),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_title_annotation_or_schema_is_a_definition_change_and_held(change: str) -> None:
    pinned = described()
    changed = CHANGES[change]
    assert definition_digest(changed, service()) != definition_digest(pinned, service())
    result = hold([offer(service(), changed, version="2.0")], {"tell-joke": pin_of(service(), pinned)})
    assert set(result.held) == {"tell-joke"} and result.offer is not None and not result.offer.tools


def test_a_tool_that_says_nothing_more_keeps_the_digest_it_always_had() -> None:
    """Pins made before these fields existed still match: nothing is held after an upgrade."""
    svc = service()
    before = {
        "description": ORIGINAL.description,
        "arguments": [a.to_wire() for a in ORIGINAL.arguments],
        "config": {},
        "service": {
            "request-queue": svc.request_queue,
            "response-queue": svc.response_queue,
            "config-params": [],
        },
    }
    assert definition_digest(ORIGINAL, svc) == hashlib.sha256(canonical_json(before).encode()).hexdigest()
    assert set(ORIGINAL.to_wire()) == {"type", "name", "description", "service", "arguments"}


def auto_approving(pinned: ToolDescriptor) -> PinBook:
    book = PinBook("same-key-higher-version")
    book._pins["default"] = {"tell-joke": pin_of(service(), pinned, signer="k1", version="1.0")}
    return book


@pytest.mark.parametrize(
    ("pinned", "offered", "approved"),
    [
        ({"destructiveHint": False}, {"destructiveHint": False}, True),  # a text edit only
        ({"destructiveHint": False}, {"destructiveHint": True}, False),
        ({"destructiveHint": False}, {}, False),  # MCP's default is destructive
        ({"readOnlyHint": True}, {"readOnlyHint": False, "destructiveHint": False}, False),
        ({"openWorldHint": False}, {"openWorldHint": True}, False),
        ({"destructiveHint": True}, {"destructiveHint": False}, True),  # safer: the signer's word is enough
    ],
)
def test_auto_approval_passes_a_text_edit_by_the_same_key_but_never_a_riskier_hint(
    pinned: dict[str, bool], offered: dict[str, bool], approved: bool
) -> None:
    book = auto_approving(described(annotations=pinned))
    changed = described(description="Tell a better joke", annotations=offered)
    result = book.effective(
        "default", [offer(service(), changed, version="1.1", signer="k1")], lambda name: False, 1.0, note=True
    )
    assert (not result.held) is approved
    pin = book.get("default", "tell-joke")
    assert pin is not None and (pin.digest == definition_digest(changed, service())) is approved
    if not approved:
        assert escalation(pin.definition, tool_definition(changed, service())) is not None
        diff = definition_diff(pin, book.pending[("default", "tell-joke")])
        changed_hints = [line for line in diff.splitlines() if line.startswith(("+ ", "- ")) and "Hint" in line]
        assert changed_hints, f"the pending diff shows the hint that changed:\n{diff}"

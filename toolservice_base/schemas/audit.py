"""One call through the MCP front, as the audit topic carries it: who called which tool, with what outcome.

Published by `toolreg mcp` on `persistent://<topicspace>/audit/mcp-calls`
when `TOOLREG_MCP_AUDIT_TOPIC` is on, one record per `tools/call`, refused
ones included; read by the registry for its page's calls per caller, by
`toolreg audit verify`, and by whatever an operator keeps an audit trail with.

Anyone who may produce on the audit namespace can publish a record, so a
record alone proves nothing. A front with a key (`TOOLREG_MCP_AUDIT_KEY`)
signs each record it publishes and chains it: `sequence` counts the records
of its chain from 1, `previous` is the hash of the record before it, and the
chain is the front's instance (`front`, fresh per process, `started` when it
began). The rules that check them are `discovery.audit_chain`'s.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .base import WireModel

MAX_AUDIT_BYTES = 64 * 1024
"""What a reader of the audit topic reads at most of one record."""

Outcome = Literal["ok", "tool_error", "denied", "rate_limited", "unknown_tool", "bad_arguments", "timeout", "failed"]
OUTCOMES: tuple[Outcome, ...] = (
    "ok",
    "tool_error",
    "denied",
    "rate_limited",
    "unknown_tool",
    "bad_arguments",
    "timeout",
    "failed",
)


class AuditRecord(WireModel):
    """`at` is the front's wall clock when the call ended; `duration_ms` from the request to the answer."""

    at: float
    front: str = Field(max_length=128)
    """The front's instance id (a fresh one per process)."""
    workspace: str = Field(max_length=128)
    subject: str = Field(max_length=512)
    """The caller: the token's `sub` (else its client id), or `stdio`, `bearer-token`, `anonymous`."""
    client_id: str = Field(default="", max_length=512)
    tool: str = Field(max_length=256)
    digest: str | None = Field(default=None, max_length=128)
    """The sha256 of the definition called (what tools/list shows in `_meta`), when the tool is known."""
    outcome: Outcome
    duration_ms: float
    detail: str = Field(default="", max_length=1024)
    """One line: the error, the missing scope, the retry-after."""
    arguments: dict[str, Any] | None = None
    """The call's arguments, only when the front is configured to record them (`TOOLREG_MCP_AUDIT_ARGUMENTS`)."""
    sequence: int | None = Field(default=None, ge=1)
    """Its place in its front's chain, from 1 (one chain per front process); None: not chained (an older front)."""
    previous: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """The sha256 (hex) of the record before it in the chain (`audit_chain.record_hash`); None for the first."""
    started: float | None = None
    """When its chain began (the front's wall clock): tells a chain that began before what the topic still keeps."""
    dropped: int = Field(default=0, ge=0)
    """Records the front dropped since the one before (its queue was full): lost, but said, not missing."""
    signature: str | None = Field(default=None, max_length=256)
    """`<key-id>:<base64 ed25519>` over the record without this field; None: the front has no key."""

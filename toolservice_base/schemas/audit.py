"""One call through the MCP front, as the audit topic carries it: who called which tool, with what outcome.

Published by `toolreg mcp` on `persistent://<topicspace>/audit/mcp-calls`
when `TOOLREG_MCP_AUDIT_TOPIC` is on, one record per `tools/call`, refused
ones included; read by the registry for its page's calls per caller, and by
whatever an operator keeps an audit trail with.
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

"""Calls per caller through the MCP fronts, for the registry page: read from the audit topic.

The MCP front and the registry are separate processes; what links them is
the persistent audit topic each front publishes a record on for every
`tools/call` (`toolreg mcp --audit-topic`). With `follow_audit` on, the
registry reads that topic with a non-durable reader (nothing is left on the
broker when it stops, and no subscription piles up a backlog) from the
start of what is retained, counting the records of the last `WINDOW`
seconds: per subject, calls, the refused ones (`denied`, `rate_limited`)
and the failed ones, when it last called and which tools. At most
`MAX_CALLERS` subjects are kept (the least recently seen go first) and
`MAX_TOOLS` tool names each, so a flood of made-up subjects costs bounded
memory. A record that does not parse is skipped and counted.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from pydantic import BaseModel, ValidationError

from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.logs import get_logger
from toolservice_base.schemas import MAX_AUDIT_BYTES, AuditRecord
from toolservice_base.transport import Transport

log = get_logger("discovery.registry")

WINDOW = 24 * 3600.0
MAX_CALLERS = 1000
MAX_TOOLS = 20
SHOWN = 100
"""Callers on the page at most, the busiest first."""
RETRY = 5.0


class CallerView(BaseModel):
    subject: str
    client_id: str = ""
    calls: int = 0
    refused: int = 0
    """`denied` (outside the caller's rights) and `rate_limited`."""
    failed: int = 0
    """Tool errors, bad arguments, timeouts, failures."""
    last_at: float = 0.0
    last_tool: str = ""
    tools: list[str] = []


class CallerBook:
    """Per-subject counts of the calls heard on the audit topic within `window` seconds."""

    def __init__(self, *, window: float = WINDOW, max_callers: int = MAX_CALLERS) -> None:
        self.window = window
        self.max_callers = max_callers
        self.callers: OrderedDict[str, CallerView] = OrderedDict()
        self.skipped = 0
        self.following = False
        """Reading the audit topic now (the page says whether calls per caller are known)."""

    def add(self, record: AuditRecord) -> None:
        if record.at < time.time() - self.window:
            return
        view = self.callers.pop(record.subject, None) or CallerView(subject=record.subject)
        view.client_id = record.client_id or view.client_id
        view.calls += 1
        view.refused += record.outcome in ("denied", "rate_limited")
        view.failed += record.outcome in ("tool_error", "bad_arguments", "timeout", "failed", "unknown_tool")
        view.last_at = max(view.last_at, record.at)
        view.last_tool = record.tool
        if record.tool not in view.tools and len(view.tools) < MAX_TOOLS:
            view.tools.append(record.tool)
        self.callers[record.subject] = view
        while len(self.callers) > self.max_callers:
            self.callers.popitem(last=False)

    def add_bytes(self, data: bytes) -> None:
        if len(data) > MAX_AUDIT_BYTES:
            self.skipped += 1
            return
        try:
            self.add(AuditRecord.model_validate_json(data))
        except ValidationError:
            self.skipped += 1

    def views(self) -> list[CallerView]:
        """The busiest callers first, at most `SHOWN`; copies (the page serialises them while calls go on)."""
        ranked = sorted(self.callers.values(), key=lambda v: (-v.calls, v.subject))[:SHOWN]
        return [v.model_copy(deep=True) for v in ranked]

    async def follow(self, transport: Transport) -> None:
        """Read the audit topic until cancelled; a broker that refuses is retried every `RETRY` seconds."""
        topic = transport.topics.mcp_audit
        while True:
            try:
                reader = await transport.reader(topic, "earliest")
            except ToolDiscoveryError as exc:
                log.warning("registry.audit_unavailable", topic=topic, error=str(exc).splitlines()[0], retry_s=RETRY)
                await asyncio.sleep(RETRY)
                continue
            self.following = True
            log.info("registry.audit_following", topic=topic)
            try:
                while True:
                    envelope = await reader.read_next(timeout=RETRY)
                    if envelope is not None:
                        self.add_bytes(envelope.data)
            finally:
                self.following = False
                await transport.close_reader(reader)

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
memory.

Only records a trusted front signed, in their place in its chain
(`discovery.audit_chain`, the trust policy's `"audit-fronts"`), are
counted: anyone who may produce on the audit namespace can publish a record
naming any subject, so every other record (unsigned, forged, a copy of one
already counted, or not parsing at all) is counted apart, as unverified,
and never shown as a caller.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel

from discovery.audit_chain import AuditVerifier
from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.logs import get_logger
from toolservice_base.schemas import AuditRecord
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

    def __init__(
        self,
        *,
        fronts: Mapping[str, Ed25519PublicKey] | None = None,
        window: float = WINDOW,
        max_callers: int = MAX_CALLERS,
    ) -> None:
        self.window = window
        self.max_callers = max_callers
        self.callers: OrderedDict[str, CallerView] = OrderedDict()
        self.verifier = AuditVerifier(fronts or {}, remember=False)
        """Judges each record against the trusted fronts; keeps each chain's last place only (bounded)."""
        self.unverified = 0
        """Records read but not counted: not signed by a trusted front in its chain's order, or not records at all."""
        self.following = False
        """Reading the audit topic now (the page says whether calls per caller are known)."""

    def add(self, record: AuditRecord) -> None:
        """Count a record already verified (`add_bytes` is the way in for what the topic carries)."""
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
        """One message of the audit topic: counted if a trusted front's, else counted apart as unverified."""
        checked = self.verifier.check_bytes(data)
        if checked.verdict == "good" and checked.record is not None:
            self.add(checked.record)
        else:
            self.unverified += 1

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

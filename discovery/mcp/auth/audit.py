"""The audit trail of the MCP front: every `tools/call`, who made it and how it ended.

Each call is one structured log event, `mcp.call` (subject, client id, tool,
definition digest, outcome, duration; the arguments only when
`TOOLREG_MCP_AUDIT_ARGUMENTS` is on, since they may hold what a caller
would not want in a log). With the audit topic on (`TOOLREG_MCP_AUDIT_TOPIC`)
the same record (`toolservice_base.schemas.AuditRecord`) is also published
on `persistent://<topicspace>/audit/mcp-calls`, kept for the `audit`
namespace's retention; the registry reads it for its page.

With a key (`TOOLREG_MCP_AUDIT_KEY`, `toolreg mcp --audit-key`) each
record published is signed and chained (`discovery.audit_chain`):
the front process is one chain, sealed in the order records are sent, so a
record dropped below never leaves a gap (the next one says how many were
dropped) and a verifier tells the front's records from anyone else's.
Without a key they are chained but unsigned, and verifiers ignore them.

Publishing never holds a call up: records go into a queue of at most
`QUEUE` records that one task sends from, in order; when the broker is
slower than the calls, the oldest waiting records are dropped and counted
(`mcp.audit_dropped`, once per window), and the log events still carry
every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from discovery.audit_chain import AuditChain
from toolservice_base.logs import get_logger
from toolservice_base.schemas import AuditRecord, canonical_json
from toolservice_base.schemas.audit import Outcome
from toolservice_base.transport import Publisher, Transport

from .policy import Caller

log = get_logger("discovery.mcp")

QUEUE = 10_000
DROPS_LOGGED_EVERY = 10.0
MAX_LOGGED_ARGUMENTS = 4096
"""Characters of the arguments' JSON a record carries at most; larger arguments are recorded as cut."""


class AuditTrail:
    """Records calls for one front: to the log always, to the audit topic when `open` was given a transport."""

    def __init__(self, workspace: str, *, arguments: bool = False, key: Ed25519PrivateKey | None = None) -> None:
        self.workspace = workspace
        self.arguments = arguments
        self.front = uuid.uuid4().hex[:12]
        self.chain = AuditChain(self.front, key)
        self.published = 0
        self.dropped = 0
        self._dropped_unsealed = 0
        """Dropped since the last record sealed: the next one says so."""
        self._queue: deque[AuditRecord] = deque(maxlen=QUEUE)
        self._ready = asyncio.Event()
        self._publisher: Publisher | None = None
        self._dropped_said = 0.0

    def record(
        self,
        caller: Caller,
        tool: str,
        outcome: Outcome,
        started: float,
        *,
        digest: str | None = None,
        detail: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> AuditRecord:
        """Log one call (and queue it for the topic); `started` is its `time.monotonic()` at the request."""
        record = AuditRecord(
            at=time.time(),
            front=self.front,
            workspace=self.workspace,
            subject=caller.subject[:512],
            client_id=caller.client_id[:512],
            tool=tool[:256],
            digest=digest,
            outcome=outcome,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
            detail=detail[:1024],
            arguments=_kept(arguments) if self.arguments and arguments is not None else None,
        )
        log.info(
            "mcp.call",
            subject=record.subject,
            client_id=record.client_id or None,
            tool=record.tool,
            digest=record.digest,
            outcome=outcome,
            duration_ms=record.duration_ms,
            **({"detail": record.detail} if record.detail else {}),
            **({"arguments": record.arguments} if record.arguments is not None else {}),
        )
        if self._publisher is not None:
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1
                self._dropped_unsealed += 1
            self._queue.append(record)
            self._ready.set()
        return record

    @contextlib.asynccontextmanager
    async def publishing(self, transport: Transport) -> AsyncIterator[AuditTrail]:
        """Publish records on the audit topic while the block runs; what is queued at its end is sent first."""
        topic = transport.topics.mcp_audit
        self._publisher = await transport.publisher(topic)
        sender = asyncio.create_task(self._send(self._publisher), name="mcp-audit")
        log.info("mcp.audit_topic", topic=topic, signed=self.chain.key is not None)
        if self.chain.key is None:
            log.warning("mcp.audit_unsigned", reason="no audit key: verifiers cannot tell these records from forgeries")
        try:
            yield self
        finally:
            publisher, self._publisher = self._publisher, None
            self._ready.set()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(sender), 5.0)
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            await transport.close_publisher(publisher)

    async def _send(self, publisher: Publisher) -> None:
        sealed: AuditRecord | None = None  # out of the queue, sealed once: sent again as it is if the broker said no
        while True:
            while self._queue or sealed is not None:
                if sealed is None:
                    sealed = self.chain.seal(self._queue.popleft(), self._dropped_unsealed)
                    self._dropped_unsealed = 0
                try:
                    await publisher.send(sealed.to_json().encode(), key=sealed.subject)
                except Exception as exc:  # the broker said no: keep the record and try again shortly
                    log.warning("mcp.audit_send_failed", error=str(exc).splitlines()[0] if str(exc) else repr(exc))
                    await asyncio.sleep(1.0)
                    continue
                sealed = None
                self.published += 1
            self._say_dropped()
            if self._publisher is None:
                return
            self._ready.clear()
            await self._ready.wait()

    def _say_dropped(self) -> None:
        if self.dropped and time.monotonic() - self._dropped_said >= DROPS_LOGGED_EVERY:
            log.warning("mcp.audit_dropped", records=self.dropped, reason="the audit topic was slower than the calls")
            self._dropped_said = time.monotonic()
            self.dropped = 0


def _kept(arguments: Mapping[str, Any]) -> dict[str, Any]:
    text = canonical_json(dict(arguments))
    if len(text) <= MAX_LOGGED_ARGUMENTS:
        return dict(arguments)
    return {"_cut": text[:MAX_LOGGED_ARGUMENTS]}

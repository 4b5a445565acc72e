"""What the registry sends to services on the `tool-probe` topic: probes, and notices of refusal.

A probe asks live services (or one instance) to re-announce: at start, and
when a heartbeat names an instance or digest the registry does not know. A
notice (a probe carrying `refused`) tells one instance that the registry
refused something it sent, and why, so the refusal shows in the service's
own log instead of only in the registry's. Both are rate-limited per
instance and overall, so a flood of unknown or refused senders cannot turn
into a flood of probes.
"""

from __future__ import annotations

import time

from toolservice_base.errors import TransportError
from toolservice_base.logs import get_logger
from toolservice_base.schemas import Probe
from toolservice_base.transport import Publisher, Transport

log = get_logger("discovery.registry")

NOTICE_LIMIT = 1000
"""Characters of a notice's reason (the `refused` field's bound)."""


class ProbeLimiter:
    """Per-instance spacing plus a global token bucket, so a flood of unknown heartbeats cannot become a probe flood."""

    def __init__(self, interval: float, per_second: float, memory: int = 10_000) -> None:
        self.interval = interval
        self.per_second = per_second
        self._last: dict[str, float] = {}
        self._broadcast = float("-inf")
        self._tokens = per_second
        self._refilled: float | None = None
        self._memory = memory

    def allow(self, instance: str | None, now: float) -> bool:
        elapsed = 0.0 if self._refilled is None else max(0.0, now - self._refilled)
        self._tokens = min(self.per_second, self._tokens + elapsed * self.per_second)
        self._refilled = now
        if instance is not None and now - max(self._last.get(instance, float("-inf")), self._broadcast) < self.interval:
            return False
        if self._tokens < 1:
            return False
        self._tokens -= 1
        if instance is None:
            self._broadcast = now
        else:
            if len(self._last) >= self._memory:
                self._last.clear()
            self._last[instance] = now
        return True


class Prober:
    """The registry's publisher on `tool-probe`."""

    def __init__(self, connection: Transport, *, interval: float, per_second: float) -> None:
        self._connection = connection
        self._probes = ProbeLimiter(interval, per_second)
        self._notices = ProbeLimiter(interval, per_second)
        self.publisher: Publisher | None = None

    async def start(self) -> None:
        self.publisher = await self._connection.publisher(self._connection.topics.tool_probe)

    async def stop(self) -> None:
        if self.publisher is not None:
            publisher, self.publisher = self.publisher, None
            await self._connection.close_publisher(publisher)

    @property
    def connected(self) -> bool:
        return self.publisher is not None and self.publisher.connected

    async def probe(self, instance: str | None, reason: str) -> None:
        """Ask `instance` (None: every live service) to announce again."""
        if self._probes.allow(instance, time.monotonic()) and await self._send(Probe(instance=instance, reason=reason)):
            log.debug("probe.sent", instance=instance, reason=reason)

    async def notify(self, instance: str, refused: str) -> None:
        """Tell `instance` what was refused and why; it logs `service.refused`."""
        if len(refused) > NOTICE_LIMIT:
            refused = refused[: NOTICE_LIMIT - 1] + "…"
        if self._notices.allow(instance, time.monotonic()) and await self._send(
            Probe(instance=instance, refused=refused)
        ):
            log.debug("notice.sent", instance=instance, refused=refused)

    async def _send(self, probe: Probe) -> bool:
        if self.publisher is None:
            return False
        try:
            await self.publisher.send(probe.to_json())
        except TransportError as exc:
            log.warning("probe.send_failed", instance=probe.instance, error=str(exc))
            return False
        return True

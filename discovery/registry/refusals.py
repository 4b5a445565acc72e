"""`Refusals`: what the registry does with anything it refuses, from whichever room refused it.

The intake refuses announcements; the writer meets a store that refuses a service's write, or a name another
service holds. Each refusal is logged, counted, kept in the rejection log (`toolreg rejections`, the page) and, where
it helps, told to the instances concerned (`probes`). Both rooms hand refusals here, so neither calls the other: the
writer used to reach the intake through callbacks tied in `Registry.__init__` to an object built after it.
"""

from __future__ import annotations

import time

from toolservice_base.logs import get_logger

from .leases import LeaseTable, ServiceKey
from .metrics import RegistryMetrics
from .probes import Prober
from .protocol import NameConflict, Rejection
from .validation import Category, RejectionLog, excerpt

log = get_logger("discovery.registry")


class Refusals:
    """Logs, counts, lists and tells what the registry refused."""

    def __init__(self, rejection_log: RejectionLog, metrics: RegistryMetrics, leases: LeaseTable, prober: Prober):
        self.rejection_log = rejection_log
        self.metrics = metrics
        self._leases = leases
        self._prober = prober

    def reject(
        self,
        reason: str,
        data: bytes,
        wall: float,
        *,
        instance: str | None = None,
        service: str | None = None,
        workspace: str | None = None,
        category: Category = "malformed",
    ) -> bool:
        """Log and count a refusal; True when it is new in the rejection log (not a repeat of the same sender)."""
        new = self.rejection_log.add(
            Rejection(
                at=wall, reason=reason, instance=instance, service=service, workspace=workspace, excerpt=excerpt(data)
            )
        )
        self.metrics.rejection(reason)
        log.warning(
            "announcement.rejected",
            reason=reason,
            instance=instance,
            service=service,
            workspace=workspace,
            bytes=len(data),
            category=category,
            repeated=not new,
        )
        return new

    def write_refused(self, key: ServiceKey, reason: str) -> None:
        """The config store refused to write service `key` (a trust policy on its queue, a value it will not take)."""
        self.reject(reason, b"", time.time(), service=key.service, workspace=key.workspace, category="store")

    async def tell_conflicts(self, key: ServiceKey, conflicts: list[NameConflict]) -> None:
        """A service was refused tool names: list it with the rejections and tell its instances, in their log."""
        reason = "; ".join(conflict.reason for conflict in conflicts)
        self.rejection_log.add(
            Rejection(at=time.time(), reason=f"conflict: {reason}", service=key.service, workspace=key.workspace)
        )
        for lease in self._leases.of_service(key):
            await self._prober.notify(lease.instance, f"conflict: {reason}")

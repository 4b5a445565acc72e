"""Calls per second per caller: a token bucket for each subject, in bounded memory.

Each caller may make `rate` calls a second on average and `burst` at once
(by default as many as a second's worth, at least one). A call over the
limit is not queued: the front answers it at once with a tool error saying
how many seconds to wait (`retry_after`), so a runaway agent cannot tie up
the front's connections or the services behind it, and other callers, who
have buckets of their own, never notice.

Memory: a bucket that has refilled is the same as no bucket, so buckets are
dropped once full (checked on the way, oldest first); beyond `max_callers`
buckets the least recently used go even if not full. Only callers with a
valid token (or the front's one local caller) get a bucket at all.
"""

from __future__ import annotations

import time
from collections import OrderedDict

MAX_CALLERS = 100_000


class RateLimiter:
    def __init__(self, rate: float, *, burst: float | None = None, max_callers: int = MAX_CALLERS) -> None:
        if rate <= 0:
            raise ValueError(f"a rate limit must be above 0 calls per second, got {rate}")
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate)
        self.max_callers = max_callers
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """Subject -> (tokens left, when counted), least recently used first."""

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, subject: str, now: float | None = None) -> float:
        """Take one call for `subject`: 0 if it may go now, else the seconds until it may."""
        now = time.monotonic() if now is None else now
        tokens, counted = self._buckets.pop(subject, (self.burst, now))
        tokens = min(self.burst, tokens + (now - counted) * self.rate)
        if tokens >= 1.0:
            tokens -= 1.0
            wait = 0.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[subject] = (tokens, now)
        self._forget(now)
        return wait

    def _forget(self, now: float) -> None:
        while self._buckets:
            subject, (tokens, counted) = next(iter(self._buckets.items()))
            full = tokens + (now - counted) * self.rate >= self.burst
            if not full and len(self._buckets) <= self.max_callers:
                return
            del self._buckets[subject]

"""What one call may take: `CallLimits`, one object from the caller down to the request client.

As httpx passes a `Timeout` and `Limits` rather than loose numbers, the
bounds of one call travel together: a `ToolSet` holds them, its reloads
hand them to every tool they build (`ToolContext.limits`), each call gives
them to its `ToolServiceClient`, and that to the `RequestClient` that waits
for the answers. A bound added later reaches every layer without a new
argument at each, and each default is written here once.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_CALL_TIMEOUT", "DEFAULT_LIMITS", "DEFAULT_MAX_ANSWER_BYTES", "CallLimits"]

DEFAULT_CALL_TIMEOUT = 30.0
"""Seconds a whole call may take, a streamed answer included."""
DEFAULT_MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""The most one answer (all its chunks, UTF-8) may bring into the caller before the call is stopped."""


@dataclass(frozen=True)
class CallLimits:
    """The bounds of one call. Past `timeout` (the whole call, a stream included) or `idle_timeout` (each wait for
    the next chunk; off when None) it raises `RequestTimeout`; past `max_answer_bytes` of answer, `AnswerTooLarge`.
    Either way the service is told to stop."""

    timeout: float = DEFAULT_CALL_TIMEOUT
    idle_timeout: float | None = None
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES

    @classmethod
    def of(cls, limits: CallLimits | float) -> CallLimits:
        """`limits` as they are, or a number of seconds as the whole call's timeout, the other bounds by default (as
        httpx takes `timeout=5.0` or a `Timeout`)."""
        return limits if isinstance(limits, CallLimits) else cls(timeout=float(limits))


DEFAULT_LIMITS = CallLimits()
"""The bounds of a call that names none."""

"""What a request carries besides its body, and the queues derived from a service's own.

Message properties, not body fields: a server that does not know one (a
TrustGraph service, an older release of ours) never sees it, whatever its
body schema, so a caller may always send them.

| property | set by | meaning |
| --- | --- | --- |
| `id` | every caller | correlates the answers with the request |
| `reply-to` | our callers | the caller's private reply queue (see `client`) |
| `timeout-ms` | our callers | how long the caller waits for the whole answer, in milliseconds from sending; the server
stops work past it |
| `tool` | the agent bridge | the name of the tool called, for a service that serves several (and its metrics and spans)
|
| `answer-signature` | a service with a signing key, on each answer | its signature over the request's id and the
answer's bytes (`signing.answer_signed_bytes`); a caller whose config for the service carries `answer-key` drops an
answer without a good one |
| `traceparent`, `tracestate` | our callers, when tracing | the W3C trace context of the caller's span, the parent of
the service's (see `tracing`) |
"""

from __future__ import annotations

import re
from functools import lru_cache

from toolservice_base.transport import Envelope

ID = "id"
REPLY_TO = "reply-to"
TIMEOUT_MS = "timeout-ms"
TOOL = "tool"
ANSWER_SIGNATURE = "answer-signature"

MAX_TOPIC_LOCAL_NAME = 200
_REPLY_SUFFIX = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
CANCEL_SUFFIX = ".cancel"


def private_queue(response_queue: str, client_id: str) -> str | None:
    """A client's own reply queue next to `response_queue`, or None if the name would be too long for a topic."""
    queue = f"{response_queue}.{client_id}"
    return queue if len(queue.rpartition("/")[2]) <= MAX_TOPIC_LOCAL_NAME else None


@lru_cache(maxsize=4096)
def reply_queue(response_queue: str, requested: str | None) -> str | None:
    """The queue a request asked to be answered on, if it is a private queue of `response_queue`.

    Anything else is ignored (the answer goes to the shared queue), so a request
    cannot make a server publish on a topic of its choosing. Remembered: a
    service hears the same few callers' queues on every request.
    """
    prefix = response_queue + "."
    if requested and requested.startswith(prefix) and _REPLY_SUFFIX.match(requested[len(prefix) :]):
        return requested
    return None


def cancel_queue(request_queue: str) -> str | None:
    """Where a caller says it gave up on a request: `<request-queue>.cancel`, or None if too long for a topic.

    Every instance of a service reads it on a subscription of its own (the
    request queue is Shared, so a cancel sent there would reach one instance,
    rarely the one doing the work); the instance running the call stops it.
    """
    queue = request_queue + CANCEL_SUFFIX
    return queue if len(queue.rpartition("/")[2]) <= MAX_TOPIC_LOCAL_NAME else None


def caller_timeout(message: Envelope) -> float | None:
    """Seconds the caller said it waits (`timeout-ms`), or None if it did not say, or said nonsense."""
    raw = message.properties.get(TIMEOUT_MS)
    if raw is None:
        return None
    try:
        millis = int(raw)
    except ValueError:
        return None
    return millis / 1000 if millis >= 0 else None


def timeout_ms(seconds: float) -> str:
    """The `timeout-ms` value for `seconds` still to wait (never negative)."""
    return str(max(0, int(seconds * 1000)))

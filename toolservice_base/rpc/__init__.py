"""Request/response over a pair of queues, correlated on the `id` property.

One import for both sides: `RequestClient` (`client`), `RequestServer`
(`server`, with what it answers in `answers`), and what travels beside a request's body (`wire`: the
message properties, the private reply queues and the cancel queue).
"""

from __future__ import annotations

from .answers import error_body
from .client import RequestClient
from .limits import DEFAULT_CALL_TIMEOUT, DEFAULT_LIMITS, DEFAULT_MAX_ANSWER_BYTES, CallLimits
from .server import MAX_REPLY_QUEUES, RequestServer
from .wire import REPLY_TO, TIMEOUT_MS, TOOL, cancel_queue, private_queue, reply_queue

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_ANSWER_BYTES",
    "CallLimits",
    "MAX_REPLY_QUEUES",
    "REPLY_TO",
    "TIMEOUT_MS",
    "TOOL",
    "RequestClient",
    "RequestServer",
    "cancel_queue",
    "error_body",
    "private_queue",
    "reply_queue",
]

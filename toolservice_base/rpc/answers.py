"""What a `RequestServer` answers with, and what a handler may ask of the request it serves."""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel

_DEADLINE_SLACK = 0.001
"""Seconds: the loop may run a timer this much (its clock resolution, far less) before it is due."""
request_deadline: ContextVar[float | None] = ContextVar("toolservice_base.rpc_server.deadline", default=None)
"""The deadline (loop time) of the request the current task serves; each request runs in a task of its own."""

Body = BaseModel | dict[str, Any] | bytes
"""An answer: a model or a dict, or its bytes already encoded (always a last answer)."""


def past_deadline() -> bool:
    """For a handler being cancelled: whether its request's deadline has passed (a timeout), as opposed to a cancel
    from its caller or the server shutting down. Lets a handler's span and logs say which."""
    deadline = request_deadline.get()
    return deadline is not None and asyncio.get_running_loop().time() >= deadline - _DEADLINE_SLACK


def error_body(kind: str, message: str) -> dict[str, Any]:
    """The error answer every server of ours understands: `{error: {type, message}, end_of_stream: true}`."""
    return {"error": {"type": kind, "message": message}, "end_of_stream": True}


def answer_too_large(reason: str) -> dict[str, Any]:
    """What a caller gets instead of an answer the broker refused for its size."""
    return error_body("answer-too-large", f"{reason}; stream it in parts (an async generator) or return less")

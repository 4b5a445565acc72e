"""From what a service's `invoke` returns to the responses it sends (DESIGN section 3).

A string is the answer as it is; a rich result (a `ToolResult`, a content
block, a list of blocks, or a dict from a tool with an output schema) travels
as `content` and `structured` beside its text rendering in `response`;
anything else is sent as `json.dumps` of it, as the spec says. An async
generator streams: one response per chunk, then an empty last one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from .schemas import ToolServiceResponse
from .schemas.content import TextContent, ToolResult, is_rich
from .tool_contract import ToolContract


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def response_for(value: Any, contract: ToolContract | None, *, end_of_stream: bool = True) -> ToolServiceResponse:
    """One response for what `invoke` returned (or a stream yielded): text as text; a rich result with its blocks
    and structured content (checked against the output schema) beside its text; anything else as `json.dumps`."""
    if isinstance(value, str):
        return ToolServiceResponse(response=value, end_of_stream=end_of_stream)
    if is_rich(value):
        result = ToolResult.of(value)
    elif isinstance(value, dict) and contract is not None and contract.has_output_schema:
        result = ToolResult(content=(TextContent(text=json.dumps(value)),), structured=value)
    else:
        return ToolServiceResponse(response=_as_text(value), end_of_stream=end_of_stream)
    if result.structured is not None and contract is not None:
        contract.check_structured(result.structured)
    return ToolServiceResponse.of_result(result, end_of_stream=end_of_stream)


async def stream_responses(chunks: AsyncGenerator[Any, Any], reply: Any, contract: ToolContract | None) -> None:
    """A streamed answer: one response per chunk, then an empty `end_of_stream` one.

    The generator is closed however this ends (a deadline, a cancel), so the
    author's `finally` blocks and `async with`s run at once, not when it is
    garbage-collected.
    """
    async with aclosing(chunks) as each:
        async for chunk in each:
            await reply(response_for(chunk, contract, end_of_stream=False))
    await reply(ToolServiceResponse(response="", end_of_stream=True))

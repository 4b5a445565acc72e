"""A streaming service: counts down, one response per number."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from toolservice_base import DynamicToolService

MAX_COUNT = 1000


class CountdownService(DynamicToolService):
    descriptor = {"id": "countdown", "config-params": [{"name": "delay", "required": False}]}
    tools = [
        {
            "name": "countdown",
            "description": "Count down from a number to zero, streaming each number",
            "delay": 0.01,
            "arguments": [{"name": "start", "type": "integer", "description": "The number to count down from"}],
        }
    ]
    version = "1.0"

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> AsyncIterator[str]:
        start = int(arguments.get("start", 3))
        if not 0 <= start <= MAX_COUNT:
            raise ValueError(f"start must be between 0 and {MAX_COUNT}")
        delay = float(config.get("delay", 0.0))
        for number in range(start, -1, -1):
            yield f"{number}\n"
            if delay:
                await asyncio.sleep(delay)

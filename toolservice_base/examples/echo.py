"""An echo service: returns its `text` argument, for latency measurements."""

from __future__ import annotations

from typing import Any

from toolservice_base import DynamicToolService


class EchoService(DynamicToolService):
    descriptor = {"id": "echo"}
    tools = [
        {
            "name": "echo",
            "description": "Return the text it is given",
            "arguments": [{"name": "text", "type": "string", "description": "The text to return"}],
        }
    ]
    version = "1.0"

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return str(arguments.get("text", ""))

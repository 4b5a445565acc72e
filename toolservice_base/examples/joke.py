"""A joke service: the spec's own example, with a `style` config param."""

from __future__ import annotations

from typing import Any

from toolservice_base import DynamicToolService

JOKES = {
    "pun": "I would tell you a joke about {topic}, but it would be too punny.",
    "dad": "Why did the {topic} go to school? To get a little brighter.",
    "dry": "{topic}. That's the joke.",
}


class JokeService(DynamicToolService):
    descriptor = {"id": "joke-service", "config-params": [{"name": "style", "required": False}]}
    tools = [
        {
            "name": "tell-joke",
            "description": "Tell a joke on a given topic",
            "style": "pun",
            "arguments": [{"name": "topic", "type": "string", "description": "The topic"}],
        }
    ]
    version = "1.0"

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        style = config.get("style") or "pun"
        template = JOKES.get(style)
        if template is None:
            raise ValueError(f"unknown joke style {style!r}; choose one of {', '.join(sorted(JOKES))}")
        return template.format(topic=arguments.get("topic", "nothing"))

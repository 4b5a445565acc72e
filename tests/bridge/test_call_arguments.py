"""`ToolSet` checks arguments against the schema it advertises, and tells the service which tool was called."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from support import static_items

from agent_bridge import BadArguments, ToolError, ToolSet
from toolservice_base import ConfigClient, DynamicToolService, Settings, ToolDiscoveryError, Transport

pytestmark = pytest.mark.contract


class Typed(DynamicToolService):
    descriptor: ClassVar[dict[str, Any]] = {"id": "typed"}
    tools: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "typed",
            "description": "Takes one argument of each kind",
            "arguments": [
                {"name": "count", "type": "integer", "description": "How many"},
                {"name": "flag", "type": "boolean", "description": "Whether"},
                {"name": "label", "type": "string", "description": "What"},
            ],
        },
        {"name": "other", "description": "A second tool of the same service"},
    ]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.calls = 0

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any], *, tool: str = "") -> str:
        self.calls += 1
        return json.dumps({"tool": tool, "arguments": arguments}, sort_keys=True)


async def typed_tools(svc: DynamicToolService, config_client: ConfigClient) -> None:
    await config_client.put(static_items(svc))


GOOD = {"count": 3, "flag": True, "label": "x"}


@pytest.mark.parametrize(
    ("arguments", "refusal"),
    [
        ({}, r"argument 'count' is missing"),
        ({"count": 1, "flag": False}, r"argument 'label' is missing"),
        ({**GOOD, "bogus": 1}, r"unknown argument 'bogus'; typed takes count, flag, label"),
        ({**GOOD, "count": "three"}, r"argument 'count': 'three' is not of type 'integer'"),
        ({**GOOD, "count": True}, r"argument 'count': true is not of type 'integer'"),
        ({**GOOD, "label": None}, r"argument 'label': null is not of type 'string'"),
        ({**GOOD, "flag": 3}, r"argument 'flag': 3 is not of type 'boolean'"),
    ],
)
async def test_arguments_that_break_the_advertised_schema_are_refused_before_sending(
    settings: Settings, connection: Transport, config_client: ConfigClient, arguments: dict[str, Any], refusal: str
) -> None:
    async with Typed(settings=settings, announce=False) as svc:
        await typed_tools(svc, config_client)
        async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
            schema = next(
                t["function"]["parameters"] for t in tools.as_openai_tools() if t["function"]["name"] == "typed"
            )
            assert schema["required"] == ["count", "flag", "label"] and schema["additionalProperties"] is False
            with pytest.raises(BadArguments, match=refusal) as caught:
                await tools.invoke("typed", arguments)
            assert isinstance(caught.value, ToolError) and isinstance(caught.value, ToolDiscoveryError)
            assert caught.value.type == "bad-arguments"
            assert "\n" not in str(caught.value)
            with pytest.raises(BadArguments, match=refusal):
                tools.stream("typed", arguments)  # refused on the call, before the first chunk is asked for
            assert svc.calls == 0
            assert json.loads(await tools.invoke("typed", GOOD))["arguments"] == GOOD
            assert svc.calls == 1


async def test_invoke_is_told_which_tool_was_called(
    settings: Settings, connection: Transport, config_client: ConfigClient
) -> None:
    async with Typed(settings=settings, announce=False) as svc:
        await typed_tools(svc, config_client)
        async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
            assert json.loads(await tools.invoke("typed", GOOD))["tool"] == "typed"
            assert json.loads(await tools.invoke("other"))["tool"] == "other"
            assert [json.loads(c)["tool"] async for c in tools.stream("other")] == ["other"]

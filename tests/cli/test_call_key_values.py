"""`toolreg call TOOL key=value ...` reads each value by the tool's own schema, `$ref`s resolved.

Pydantic models and the MCP SDK reach a nested object through `$ref` into
`$defs`; a reader that looks only at a property's own `type` takes such an
argument for a string and the call is refused for a value the user wrote
right. Every value here goes through a real service on a real broker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field
from support import atoolreg, toolreg_env

from discovery.cli.common import CommandError
from discovery.cli.tool_arguments import argument_kinds, read_arguments
from toolservice_base import ConfigClient, DynamicToolService, Settings


class Location(BaseModel):
    city: str
    country: str | None = None


class Forecast(BaseModel):
    location: Location
    days: int = Field(default=1, ge=1)
    hourly: bool = False
    places: list[Location] = []
    note: str = ""
    fallback: Location | None = None


class Weather(DynamicToolService):
    descriptor = {"id": "weather"}
    tools = [{"name": "forecast", "description": "The weather", "input-schema": Forecast}]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any], *, tool: str = "") -> Any:
        return json.dumps(arguments, sort_keys=True)


SCHEMA = Forecast.model_json_schema()


def test_the_kinds_come_from_the_resolved_schema() -> None:
    assert "$ref" in json.dumps(SCHEMA["properties"]["location"])  # what pydantic writes
    assert argument_kinds(SCHEMA) == {
        "location": ["object"],
        "days": ["integer"],
        "hourly": ["boolean"],
        "places": ["array"],
        "note": ["string"],
        "fallback": ["object", "null"],
    }


def test_values_are_read_by_kind_and_a_value_that_is_not_json_names_its_path() -> None:
    read = read_arguments(
        ['location={"city":"Oslo"}', "days=3", "hourly=true", 'places=[{"city":"Bergen"}]', "note=3", "fallback=null"],
        SCHEMA,
    )
    assert read == {
        "location": {"city": "Oslo"},
        "days": 3,
        "hourly": True,
        "places": [{"city": "Bergen"}],
        "note": "3",  # a string stays the text typed
        "fallback": None,
    }
    with pytest.raises(CommandError, match=r"argument at \$\.location takes an object, .*'Oslo' is not JSON"):
        read_arguments(["location=Oslo"], SCHEMA)


@pytest.fixture
async def weather(tmp_path: Path, settings: Settings, config_client: ConfigClient) -> Any:
    async with Weather(settings=settings, announce=False) as service:
        await config_client.put(
            [("tool-service", service.id, service.service_descriptor.to_json())]
            + [("tool", t.name, t.to_json()) for t in service.tool_descriptors]
        )
        yield toolreg_env(settings.pulsar_url or "", tmp_path)


async def test_an_object_reached_through_ref_is_taken_as_json(weather: dict[str, str]) -> None:
    done = await atoolreg("call", "forecast", 'location={"city":"Oslo"}', "days=2", env=weather)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"location": {"city": "Oslo"}, "days": 2}


async def test_a_refusal_shows_the_resolved_kinds(weather: dict[str, str]) -> None:
    done = await atoolreg("call", "forecast", 'location={"town":"Oslo"}', env=weather)
    assert done.returncode == 1 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "$.location" in done.stderr
    takes = done.stderr.partition("; it takes: ")[2].split()
    assert sorted(takes) == sorted(
        ["location=<object>", "days=<integer>", "hourly=<boolean>", "places=<array>", "note=<string>"]
        + ["fallback=<object|null>"]
    )
    not_json = await atoolreg("call", "forecast", "location=Oslo", env=weather)
    assert not_json.returncode == 1 and "$.location takes an object" in not_json.stderr

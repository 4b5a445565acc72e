"""What a stranger writes in a tool's title or description, or a service in its answer, reaches the terminal as
visible escapes, never as control sequences (round five, row 8): ESC (`ESC[2J` clears the screen), NUL, C1
controls, U+202E."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from support import atoolreg, eventually, toolreg_env
from support.store import registry_lists

from discovery.registry.service import Registry
from discovery.shown import shown
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, DynamicToolService, Settings
from toolservice_base.schemas import ToolDescriptor, ToolServiceDescriptor

HOSTILE_DESCRIPTION = "Weather forecast\x1b[2J\x1b]0;pwned\x07 for a city\x00, \u202eevil\u202c \x9b31m\x7f done"
HOSTILE_TITLE = "Forecast\x1b[2J\u2066"
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""What must never reach a terminal raw: C0 controls but tab and newline, DEL, C1 controls, bidi controls."""


def test_control_and_bidi_characters_are_written_as_visible_escapes() -> None:
    assert shown("a\x1b[2Jb\x00c\u202ed\x7fe\x85f") == "a\\u001b[2Jb\\u0000c\\u202ed\\u007fe\\u0085f"
    assert shown("line one\n\tline two, déjà vu, 天気, שלום") == "line one\n\tline two, déjà vu, 天気, שלום"


async def test_toolreg_never_writes_a_control_character_from_a_tool_s_text(
    tmp_path: Path,
    settings: Settings,
    config_store: ConfigStoreService,
    config_client: ConfigClient,
    registry: Registry,
) -> None:
    service = ToolServiceDescriptor.model_validate(
        {
            "id": "weather-service",
            "request-queue": "non-persistent://tg/request/weather-service",
            "response-queue": "non-persistent://tg/response/weather-service",
        }
    )
    tool = ToolDescriptor(name="weather", title=HOSTILE_TITLE, description=HOSTILE_DESCRIPTION, service=service.id)
    await config_client.put([("tool-service", service.id, service.to_json()), ("tool", tool.name, tool.to_json())])
    await eventually(lambda: registry_lists(registry, "weather"), timeout=10)
    env = toolreg_env(settings.pulsar_url or "", tmp_path)
    commands = [
        ("tools",),
        ("tools", "-o", "wide"),
        ("tools", "-o", "yaml"),
        ("tools", "-o", "json"),
        ("tools", "--search", "weather forecast city"),
        ("tools", "--search", "weather forecast city", "-o", "wide"),
        ("config", "get", "tool/weather"),
        ("config", "get", "tool/weather", "--json"),
    ]
    refused = [("config", "get", "tool/weather\x1b[2J\u202e"), ("call", "weather\x1b[2J\u202e")]
    for command in commands + refused:
        done = await atoolreg(*command, env=env)
        assert (done.returncode == 0) == (command not in refused), (command, done.stderr)
        raw = sorted({hex(ord(c)) for c in UNSAFE.findall(done.stdout + done.stderr)})
        assert raw == [], (command, raw)
        if command in refused:  # one line naming what was asked for, escaped
            assert done.stderr.count("\n") == 1 and "2J" in done.stderr, done.stderr
    searched = await atoolreg("tools", "--search", "weather forecast city", env=env)
    assert "\\u001b[2J" in searched.stdout and "\\u202eevil" in searched.stdout
    # JSON output is the same data: the escapes are JSON's own, read back as the characters they stand for.
    as_json = json.loads((await atoolreg("config", "get", "tool/weather", "--json", env=env)).stdout)
    assert as_json["value"]["description"] == HOSTILE_DESCRIPTION and as_json["value"]["title"] == HOSTILE_TITLE


class Forecaster(DynamicToolService):
    """A service whose answers carry what a hostile one would send: a streamed answer, then a whole one."""

    descriptor = {"id": "forecaster"}
    tools = [{"name": "forecast", "description": "Tomorrow's weather", "arguments": []}]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> AsyncIterator[str]:
        yield "sunny\x1b[2J"
        yield "\u202edlrow\x00 \x9b31m"


async def test_a_tool_s_answer_reaches_the_terminal_escaped(
    tmp_path: Path, settings: Settings, config_client: ConfigClient
) -> None:
    async with Forecaster(settings=settings, announce=False) as service:
        await config_client.put(
            [("tool-service", service.id, service.service_descriptor.to_json())]
            + [("tool", t.name, t.to_json()) for t in service.tool_descriptors]
        )
        env = toolreg_env(settings.pulsar_url or "", tmp_path)
        streamed = await atoolreg("call", "forecast", env=env)
        assert streamed.returncode == 0, streamed.stderr
        assert streamed.stdout == "sunny\\u001b[2J\\u202edlrow\\u0000 \\u009b31m\n"
        as_json = await atoolreg("call", "forecast", "--json", env=env)
        assert json.loads(as_json.stdout)["observation"] == "sunny\x1b[2J\u202edlrow\x00 \x9b31m"
        assert not UNSAFE.search(as_json.stdout)

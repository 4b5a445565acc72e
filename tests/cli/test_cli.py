"""`toolreg` as a user meets it: help, one-line errors, the config commands and the tg-* aliases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support import atoolreg, toolreg, toolreg_env

from discovery.broker import EmbeddedBroker
from discovery.cli.main import build_parser
from toolservice_base import ConfigClient, DynamicToolService, Settings

BIN = Path(sys.executable).parent

SERVICE = {
    "id": "joke-service",
    "request-queue": "non-persistent://tg/request/joke-service",
    "response-queue": "non-persistent://tg/response/joke-service",
    "config-params": [{"name": "style"}],
}


def all_commands() -> list[list[str]]:
    parser = build_parser()
    commands: list[list[str]] = []

    def walk(p, prefix: list[str]) -> None:  # noqa: ANN001
        for action in p._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                for name, sub in action.choices.items():
                    commands.append(prefix + [name])
                    walk(sub, prefix + [name])

    walk(parser, [])
    return commands


@pytest.mark.parametrize("command", all_commands(), ids=lambda c: " ".join(c))
def test_every_command_has_help(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "discovery.cli", *command, "--help"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert "usage: toolreg" in result.stdout


def test_without_a_broker_the_error_is_one_line_saying_what_to_do(tmp_path: Path) -> None:
    env = toolreg_env("", tmp_path)
    env.pop("PULSAR_URL")
    result = toolreg("config", "list", "tool", env=env)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "toolreg up" in result.stderr and "PULSAR_URL" in result.stderr


def test_a_store_that_does_not_answer_is_reported(tmp_path: Path, broker: EmbeddedBroker) -> None:
    result = toolreg("config", "list", "tool", "--timeout", "0.5", env=toolreg_env(broker.url or "", tmp_path))
    assert result.returncode == 1
    assert "did not answer" in result.stderr and "toolreg up" in result.stderr


async def test_config_put_get_list_delete(tmp_path: Path, broker: EmbeddedBroker, config_store) -> None:  # noqa: ANN001
    env = toolreg_env(broker.url or "", tmp_path)
    put = await atoolreg("config", "put", "tool-service/joke-service", env=env, input=json.dumps(SERVICE))
    assert put.returncode == 0, put.stderr
    assert "version 1" in put.stdout
    got = await atoolreg("config", "get", "tool-service/joke-service", env=env)
    assert json.loads(got.stdout) == SERVICE
    listed = await atoolreg("config", "list", "tool-service", env=env)
    assert listed.stdout.split() == ["joke-service"]
    deleted = await atoolreg("config", "delete", "tool-service/joke-service", env=env)
    assert deleted.returncode == 0 and "version 2" in deleted.stdout
    missing = await atoolreg("config", "get", "tool-service/joke-service", env=env)
    assert missing.returncode == 1 and "not found" in missing.stderr


async def test_a_bad_item_is_refused_naming_the_field(tmp_path: Path, broker: EmbeddedBroker, config_store) -> None:  # noqa: ANN001
    env = toolreg_env(broker.url or "", tmp_path)
    bad = {**SERVICE, "response-queue": "tg/response/joke"}
    result = await atoolreg("config", "put", "tool-service/joke-service", "--value", json.dumps(bad), env=env)
    assert result.returncode == 1
    assert "response-queue" in result.stderr
    assert config_store.store.version == 0


async def test_the_tg_aliases_take_the_spec_form(tmp_path: Path, broker: EmbeddedBroker, config_store) -> None:  # noqa: ANN001
    import asyncio

    env = toolreg_env(broker.url or "", tmp_path)

    async def run(name: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = await asyncio.create_subprocess_exec(
            str(BIN / name), *args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await proc.communicate(stdin.encode() if stdin else None)
        return subprocess.CompletedProcess([name], proc.returncode or 0, out.decode(), err.decode())

    assert (await run("tg-put-config-item", "tool-service/joke-service", stdin=json.dumps(SERVICE))).returncode == 0
    assert (await run("tg-list-config-items", "tool-service")).stdout.split() == ["joke-service"]
    assert json.loads((await run("tg-get-config-item", "tool-service/joke-service")).stdout)["id"] == "joke-service"
    assert (await run("tg-delete-config-item", "tool-service/joke-service")).returncode == 0
    assert config_store.store.list("default", "tool-service") == []


def test_serve_refuses_something_that_is_not_a_service(tmp_path: Path) -> None:
    env = toolreg_env("pulsar://127.0.0.1:1", tmp_path)
    result = toolreg("serve", "json:JSONDecoder", env=env)
    assert result.returncode == 1 and "not a DynamicToolService subclass" in result.stderr
    result = toolreg("serve", "no_such_module:Thing", env=env)
    assert result.returncode == 1 and "cannot import" in result.stderr


class Counted(DynamicToolService):
    descriptor: ClassVar[dict[str, Any]] = {"id": "counted"}
    tools: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "count-to",
            "description": "Counts",
            "arguments": [{"name": "start", "type": "integer", "description": "From"}],
        }
    ]
    calls = 0

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        type(self).calls += 1
        return str(arguments["start"])


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ([], "argument 'start' is missing"),
        (["start=3", "bogus=1"], "unknown argument 'bogus'"),
        (["start=1.5"], "argument 'start': 1.5 is not of type 'integer'"),
        (["start=true"], "argument 'start': true is not of type 'integer'"),  # said as JSON, the way it was typed
        (["start=null"], "argument 'start': null is not of type 'integer'"),
    ],
)
async def test_call_refuses_arguments_the_tool_does_not_take_in_one_line(
    tmp_path: Path, settings: Settings, config_client: ConfigClient, arguments: list[str], named: str
) -> None:
    async with Counted(settings=settings, announce=False) as counted:
        await config_client.put(
            [("tool-service", counted.id, counted.service_descriptor.to_json())]
            + [("tool", t.name, t.to_json()) for t in counted.tool_descriptors]
        )
        env = toolreg_env(settings.pulsar_url or "", tmp_path)
        Counted.calls = 0
        result = await atoolreg("call", "count-to", *arguments, env=env)
        assert result.returncode == 1
        assert result.stdout == ""
        assert result.stderr.strip().count("\n") == 0, result.stderr
        assert named in result.stderr and "it takes: start=<integer>" in result.stderr
        assert Counted.calls == 0  # refused before anything was sent
        assert (await atoolreg("call", "count-to", "start=7", env=env)).stdout == "7\n"
        assert Counted.calls == 1

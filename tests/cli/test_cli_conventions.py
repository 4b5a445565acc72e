"""What a user expects of `toolreg`'s commands after the first hour.

Where the broker URL is looked for and how to point a command at it; `store export` on a machine aimed at a cluster;
`--timeout` on `replicas` as on the other commands that ask; a typo of a config type; `config get --json`; and
`-o wide|yaml|name` and `--no-headers` on every command that prints a table, as kubectl users expect.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from support import atoolreg, eventually, toolreg, toolreg_env
from support.store import registry_lists

from discovery.broker.embedded import reserve_port
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings
from toolservice_base.examples.joke import JokeService

SERVICE = {
    "id": "joke-service",
    "request-queue": "non-persistent://tg/request/joke-service",
    "response-queue": "non-persistent://tg/response/joke-service",
    "config-params": [{"name": "style"}],
}


def no_broker_env(tmp_path: Path) -> dict[str, str]:
    env = toolreg_env("", tmp_path / "here")
    env.pop("PULSAR_URL")
    return env


def test_without_a_broker_url_the_error_says_where_it_looked_and_how_to_point_elsewhere(tmp_path: Path) -> None:
    result = toolreg("tools", env=no_broker_env(tmp_path))
    assert result.returncode == 1
    line = result.stderr.strip()
    assert "\n" not in line and f"no {tmp_path / 'here' / 'broker.url'} found" in line
    assert "--data-dir" in line and "TOOLREG_DATA_DIR" in line and "same directory" in line


def test_store_export_on_a_machine_aimed_at_a_cluster_hints_at_the_replicated_store(tmp_path: Path) -> None:
    env = toolreg_env("pulsar://broker.example:6650", tmp_path / "data")
    result = toolreg("store", "export", str(tmp_path / "out.json"), env=env)
    assert result.returncode == 1
    line = result.stderr.strip()
    assert "\n" not in line and "no SQLite config store at" in line
    assert "PULSAR_URL is set" in line and "--store pulsar" in line and "TOOLREG_STORE=pulsar" in line
    helped = toolreg("store", "--help", env=env)
    assert "export and import" in helped.stdout and "needs the broker" in " ".join(helped.stdout.split())


def test_replicas_takes_a_timeout_for_the_broker_like_the_other_commands(tmp_path: Path) -> None:
    with reserve_port() as nothing_listens:
        port = nothing_listens.getsockname()[1]
    env = toolreg_env(f"pulsar://127.0.0.1:{port}", tmp_path)
    started = time.monotonic()
    result = toolreg("replicas", "--timeout", "1", env=env)
    assert time.monotonic() - started < 10
    assert result.returncode == 1 and "cannot reach the broker" in result.stderr
    assert result.stderr.strip().count("\n") == 0


async def test_config_list_of_a_type_nothing_holds_names_the_types_there(
    tmp_path: Path, settings: Settings, config_client: ConfigClient
) -> None:
    await config_client.put([("tool-service", "joke-service", json.dumps(SERVICE)), ("prompt", "greeting", '"hi"')])
    env = toolreg_env(settings.pulsar_url or "", tmp_path)
    typo = await atoolreg("config", "list", "tols", env=env)
    assert typo.returncode == 1 and typo.stdout == ""
    assert typo.stderr.strip() == (
        "toolreg: no items of type 'tols' in workspace 'default', and no such type there: the types are prompt, tool,"
        " tool-service; did you mean tool?"
    )
    empty = await atoolreg("config", "list", "tool", env=env)  # a type the product uses: empty is no mistake
    assert (empty.returncode, empty.stdout) == (0, "")
    prompts = await atoolreg("config", "list", "prompt", env=env)
    assert (prompts.returncode, prompts.stdout) == (0, "greeting\n")


async def test_config_get_json_is_one_object_with_the_value_parsed(
    tmp_path: Path, settings: Settings, config_client: ConfigClient
) -> None:
    await config_client.put([("tool-service", "joke-service", json.dumps(SERVICE)), ("note", "plain", "not json")])
    env = toolreg_env(settings.pulsar_url or "", tmp_path)
    got = await atoolreg("config", "get", "tool-service/joke-service", "--json", env=env)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == {
        "type": "tool-service",
        "key": "joke-service",
        "workspace": "default",
        "value": SERVICE,
    }
    text = await atoolreg("config", "get", "note/plain", "--json", env=env)
    assert json.loads(text.stdout)["value"] == "not json"


async def test_tables_take_output_formats_and_no_headers(
    tmp_path: Path, settings: Settings, config_store: ConfigStoreService, registry: Registry
) -> None:
    env = toolreg_env(settings.pulsar_url or "", tmp_path)
    async with JokeService(settings=settings, ttl=5):
        await eventually(lambda: registry_lists(registry, "tell-joke"), timeout=5)
        table = await atoolreg("tools", env=env)
        assert table.stdout.splitlines()[0].split()[:3] == ["TOOL", "SERVICE", "SOURCE"]
        wide = await atoolreg("tools", "-o", "wide", env=env)
        header = wide.stdout.splitlines()[0].split()
        assert {"WORKSPACE", "VERSION", "DIGEST"} <= set(header) and header[-1] == "WHY"
        row = wide.stdout.splitlines()[1]
        digest = next(t for t in await registry.list_tools() if t.name == "tell-joke").digest
        assert digest is not None and digest in row and " default " in row and " 1.0 " in row
        headless = await atoolreg("tools", "--no-headers", env=env)
        assert headless.stdout.splitlines()[0].startswith("tell-joke ")
        names = await atoolreg("tools", "-o", "name", env=env)
        assert names.stdout == "tell-joke\n"
        as_yaml = yaml.safe_load((await atoolreg("tools", "-o", "yaml", env=env)).stdout)
        as_json = json.loads((await atoolreg("tools", "-o", "json", env=env)).stdout)
        assert [t["name"] for t in as_yaml] == ["tell-joke"] and as_yaml[0]["status"] == "live"
        moving = {"last_heartbeat_age", "usage"}  # a heartbeat between the two commands changes these
        assert {k: v for k, v in as_yaml[0].items() if k not in moving} == {
            k: v for k, v in as_json[0].items() if k not in moving
        }
    both = await atoolreg("tools", "--json", "-o", "yaml", env=env)
    assert both.returncode == 1 and "--json and -o yaml ask for two formats" in both.stderr
    for command in ("rejections", "conflicts", "pending"):
        empty = await atoolreg(command, "--no-headers", env=env)
        assert (empty.returncode, empty.stdout) == (0, ""), (command, empty.stderr)
        assert yaml.safe_load((await atoolreg(command, "-o", "yaml", env=env)).stdout) == []


def test_trust_list_takes_the_same_formats(tmp_path: Path) -> None:
    env = no_broker_env(tmp_path)
    policy = str(tmp_path / "trust.json")
    assert toolreg("keygen", str(tmp_path / "jokes.key"), env=env).returncode == 0
    public = (tmp_path / "jokes.key.pub").read_text().strip()
    added = toolreg(
        "trust", "add", "jokes", "--public-key", public, "--services", "joke-*", "--tools", "tell-*",
        "--policy", policy, env=env,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert toolreg("trust", "list", "--policy", policy, "-o", "name", env=env).stdout == "jokes\n"
    wide = toolreg("trust", "list", "--policy", policy, "-o", "wide", env=env).stdout
    assert "PUBLIC KEY" in wide.splitlines()[0] and public in wide
    headless = toolreg("trust", "list", "--policy", policy, "--no-headers", env=env).stdout
    assert headless.splitlines() == [headless.splitlines()[0]] and headless.startswith("jokes ")
    listed = yaml.safe_load(toolreg("trust", "list", "--policy", policy, "-o", "yaml", env=env).stdout)
    assert listed[0]["name"] == "jokes" and listed[0]["public_key"] == public


def test_a_watch_takes_a_table_or_json_and_says_so_of_the_other_formats(tmp_path: Path) -> None:
    for chosen in (["-o", "yaml"], ["-o", "name"], ["-o", "wide"], ["--no-headers"]):
        result = toolreg("tools", "--watch", *chosen, env=no_broker_env(tmp_path))
        assert result.returncode == 1 and "--watch prints a table" in result.stderr, (chosen, result.stderr)

"""Settings: each environment variable declared once, read by the part of the product that uses it, described in the
operators' guide with the default the code has.

A settings class (`toolservice_base.variables.FromEnv`) reads its variables from the mapping it is given; a value
it cannot use stops the reader in one line naming the variable. The floor's `Settings` holds only what every
process needs to reach the broker.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import dataclasses
import importlib
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sniffio

from discovery.broker.settings import AdminSettings
from discovery.cli.main import run_loop
from discovery.mcp.settings import TOKEN_ALGORITHMS, McpSettings
from discovery.registry.settings import RegistrySettings
from discovery.replicas.settings import ReplicaSettings
from discovery.store.settings import StoreSettings
from discovery.web.settings import HttpSettings
from toolservice_base.errors import NoBrokerError, SettingsError, ToolDiscoveryError
from toolservice_base.mcp_service.settings import SidecarSettings
from toolservice_base.search.settings import SearchSettings
from toolservice_base.settings import MOVED, Settings, event_loop
from toolservice_base.variables import DECLARED, Variable, variables

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("toolservice_base", "discovery", "agent_bridge")
CLASSES = (
    Settings,
    McpSettings,
    RegistrySettings,
    StoreSettings,
    ReplicaSettings,
    HttpSettings,
    AdminSettings,
    SearchSettings,
    SidecarSettings,
)
VARIABLE_NAME = re.compile(r"^(TOOLREG|PULSAR)_[A-Z_]+$|^NO_COLOR$")


def test_the_floor_holds_only_what_every_process_needs_to_reach_the_broker() -> None:
    fields = {field.name for field in dataclasses.fields(Settings)}
    assert fields == {
        "data_dir",
        "pulsar_url",
        "auth_token",
        "signing_key_file",
        "broker",
        "topicspace",
        "operation_timeout",
    }


def test_each_variable_is_spelled_once_in_the_product() -> None:
    """Its name as a whole string appears in one place: its declaration (help texts and messages ask the class)."""
    spelled: Counter[str] = Counter()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and VARIABLE_NAME.match(node.value):
                    spelled[node.value] += 1
    assert set(DECLARED) <= set(spelled)
    assert {name: count for name, count in spelled.items() if count != 1} == {}


def test_every_variable_is_declared_with_its_help() -> None:
    with pytest.raises(ValueError, match="TOOLREG_NOTHING is declared without its help"):
        Variable("TOOLREG_NOTHING", lambda name, value: value, "", " ")
    assert "TOOLREG_NOTHING" not in DECLARED
    assert all(variable.help.strip() for variable in DECLARED.values())


def test_a_settings_class_reads_the_mapping_it_is_given_and_blank_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLREG_MCP_RATE_LIMIT", "nonsense from the process environment")
    given = {
        "TOOLREG_MCP_RATE_LIMIT": "2.5",
        "TOOLREG_MCP_TOKEN_ALGORITHMS": " ES256 , EdDSA ",
        "TOOLREG_MCP_AUDIT_TOPIC": "Yes",
        "TOOLREG_MCP_AUDIT_ARGUMENTS": "on",
        "TOOLREG_MCP_OAUTH_ISSUER": "   ",
        "TOOLREG_MCP_POLICY": "policy.json",
    }
    front = McpSettings.from_env(given)
    assert front.rate_limit == 2.5 and front.token_algorithms == ("ES256", "EdDSA")
    assert front.audit_topic and not front.audit_arguments, "only 1, true and yes turn a flag on"
    assert front.oauth_issuer is None and front.policy == Path("policy.json")
    assert McpSettings.from_env({}) == McpSettings(), "unset: the declared defaults"
    assert McpSettings().token_algorithms == TOKEN_ALGORITHMS and McpSettings().session_idle == 300.0


def test_one_variable_is_read_alone_by_a_part_that_needs_only_it() -> None:
    """The registry follows the fronts' audit topic: it reads that flag, not the rest of the front's settings."""
    broken_front = {"TOOLREG_MCP_CLOCK_SKEW": "soon", "TOOLREG_MCP_AUDIT_TOPIC": "1"}
    assert McpSettings.variable("audit_topic").read(broken_front) is True
    with pytest.raises(SettingsError):
        McpSettings.from_env(broken_front)


REFUSALS = [
    (HttpSettings, "TOOLREG_METRICS_PORT", "nine", r"is not a whole number \(a port\)$"),
    (RegistrySettings, "TOOLREG_MAX_INSTANCES", "lots", r"is not a whole number of instances$"),
    (RegistrySettings, "TOOLREG_MAX_CLOCK_SKEW", "soon", r"is not a number of seconds$"),
    (RegistrySettings, "TOOLREG_MAX_CLOCK_SKEW", "nan", r"is not a number of seconds$"),
    (McpSettings, "TOOLREG_MCP_CLOCK_SKEW", "400", r"is out of range: use 0 to 300 seconds$"),
    (McpSettings, "TOOLREG_MCP_RATE_LIMIT", "nan", r"is out of range: use 0\.001 to 1e\+06 calls per second$"),
    (McpSettings, "TOOLREG_MCP_MAX_SESSIONS", "many", r"is not a whole number of sessions$"),
    (SearchSettings, "TOOLREG_SEARCH_EMBEDDER", "openai:small", r"is not an embedder; use wordllama, bm25, "),
]
"""(class, variable, value, the rest of the line after `VARIABLE='value' `)."""


@pytest.mark.parametrize(("cls", "name", "value", "rest"), REFUSALS)
def test_a_value_that_cannot_be_read_is_one_line_naming_the_variable_and_what_it_takes(
    cls: Any, name: str, value: str, rest: str
) -> None:
    with pytest.raises(SettingsError, match=f"^{name}='{re.escape(value)}' {rest}"):
        cls.from_env({name: value})


@pytest.mark.parametrize(
    ("cls", "environ", "message"),
    [
        (McpSettings, {"TOOLREG_MCP_MAX_SESSIONS": "0"}, r"^TOOLREG_MCP_MAX_SESSIONS=0: give at least 1$"),
        (
            SidecarSettings,
            {"TOOLREG_MCP_MAX_MESSAGE": "512"},
            r"^TOOLREG_MCP_MAX_MESSAGE=512: give at least 1024 bytes$",
        ),
        (
            StoreSettings,
            {"TOOLREG_CHANGE_WINDOW_BYTES": "0"},
            r"^TOOLREG_CHANGE_WINDOW_KEYS and TOOLREG_CHANGE_WINDOW_BYTES must be at least 1$",
        ),
        (
            McpSettings,
            {"TOOLREG_MCP_TOKEN_ALGORITHMS": "RS256,HS256,none"},
            r"^TOOLREG_MCP_TOKEN_ALGORITHMS names HS256, none: access tokens are checked against the issuer's public"
            r" keys, so only RS256, .*EdDSA may be allowed$",
        ),
        (
            AdminSettings,
            {"PULSAR_ADMIN_TOKEN_FILE": "/nonexistent/admin.token"},
            r"^cannot read PULSAR_ADMIN_TOKEN_FILE '/nonexistent/admin.token': No such file or directory; fix the path"
            r" or unset it$",
        ),
    ],
)
def test_a_value_that_cannot_be_used_is_one_line_naming_the_variable(
    cls: Any, environ: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        cls.from_env(environ)


def test_the_broker_settings_take_the_flags_first_and_the_token_file_second(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-the-file\n")
    environ = {
        "PULSAR_URL": "pulsar://broker:6650",
        "TOOLREG_TOPICSPACE": " acme ",
        "TOOLREG_DATA_DIR": str(tmp_path / "env"),
        "PULSAR_AUTH_TOKEN_FILE": str(token_file),
    }
    settings = Settings.from_env(environ=environ)
    assert (settings.pulsar_url, settings.topicspace, settings.auth_token) == (
        "pulsar://broker:6650",
        "acme",
        "from-the-file",
    )
    flagged = Settings.from_env(tmp_path / "flag", "pulsar://other:6650", "research", environ=environ)
    assert (flagged.data_dir, flagged.pulsar_url, flagged.topicspace) == (
        tmp_path / "flag",
        "pulsar://other:6650",
        "research",
    )
    assert Settings.from_env(environ={**environ, "PULSAR_AUTH_TOKEN": "inline"}).auth_token == "inline"
    with pytest.raises(NoBrokerError, match="^cannot read PULSAR_AUTH_TOKEN_FILE '/nonexistent': No such file"):
        Settings.from_env(environ={"PULSAR_AUTH_TOKEN_FILE": "/nonexistent"})
    with pytest.raises(NoBrokerError, match="; fix TOOLREG_TOPICSPACE or --topicspace$"):
        Settings.from_env(environ={"TOOLREG_TOPICSPACE": "a/b"})
    with pytest.raises(NoBrokerError, match="^TOOLREG_BROKER='kafka' is not a broker kind; use one of "):
        Settings.from_env(environ={"TOOLREG_BROKER": "kafka"})


def test_the_event_loop_is_read_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLREG_EVENT_LOOP", "Trio")
    with pytest.raises(ToolDiscoveryError, match="^TOOLREG_EVENT_LOOP='trio': use uvloop or asyncio$"):
        event_loop()
    monkeypatch.setenv("TOOLREG_EVENT_LOOP", "asyncio")
    assert event_loop() == "asyncio"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_command_tells_sniffio_it_runs_on_asyncio_in_every_task(monkeypatch: pytest.MonkeyPatch, loop: str) -> None:
    """anyio asks sniffio for each cancel scope and event; told, sniffio needs no system call to answer."""
    pytest.importorskip(loop)
    monkeypatch.setenv("TOOLREG_EVENT_LOOP", loop)

    async def told() -> str | None:
        return sniffio.current_async_library_cvar.get()

    async def command(args: argparse.Namespace) -> int:
        in_a_task = await asyncio.create_task(told())  # a task started by the command inherits what it was told
        return 0 if in_a_task == await told() == sniffio.current_async_library() == "asyncio" else 1

    assert sniffio.current_async_library_cvar.get() is None
    assert run_loop(command, argparse.Namespace()) == 0


# --- the operators' guide -------------------------------------------------------------------


def settings_table() -> dict[str, str]:
    """The default column of docs/operators.md's "Settings and their defaults" table, by variable."""
    text = (ROOT / "docs" / "operators.md").read_text()
    section = text.split("## Settings and their defaults", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| `")]
    return {cells[1].strip().strip("`"): cells[3] for cells in rows}


def shown(default: Any) -> str:
    """A declared default as the guide writes it."""
    if isinstance(default, tuple):
        return ",".join(default)
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def test_the_operators_guide_describes_every_variable_with_the_default_the_code_has() -> None:
    documented = settings_table()
    missing = sorted(set(DECLARED) - set(documented))
    assert not missing, f"docs/operators.md's settings table has no row for {missing}"
    undeclared = sorted(name for name in documented if name not in DECLARED and not name.startswith("OTEL_"))
    assert not undeclared, f"the settings table describes variables nothing declares: {undeclared}"
    for cls in CLASSES:
        for variable in variables(cls).values():
            if variable.default not in (None, False, "", ()):
                assert shown(variable.default) in documented[variable.name], (variable.name, variable.default)


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_field_that_left_settings_says_in_one_line_which_class_reads_it_now(name: str) -> None:
    with pytest.raises(AttributeError) as raised:
        getattr(Settings(), name)
    assert str(raised.value) == f"Settings.{name} moved: read it with {MOVED[name]} (same environment variable)"
    owner, field = MOVED[name].split(".from_env().")
    module, cls = owner.rsplit(".", 1)
    read = getattr(importlib.import_module(module), cls).from_env({})
    assert hasattr(read, field), f"{MOVED[name]} names no field of {owner}"

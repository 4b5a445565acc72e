"""Issue 23, a newcomer's first hour: one status everywhere, timeouts that hold, and the CLI's conventions.

Where a terminal matters (what is said while waiting, the prompt of
`config put`), the command runs on a pseudo-terminal, as a user's would.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import pty
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support import atoolreg, eventually, static_items, toolreg, toolreg_env
from support.registry import FAST

from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, DynamicToolService, Settings, Transport, configure_logging
from toolservice_base.examples.joke import JokeService
from toolservice_base.logs import get_logger
from toolservice_base.schemas import ToolDescriptor

SERVICE = {
    "id": "static-service",
    "request-queue": "non-persistent://tg/request/static-service",
    "response-queue": "non-persistent://tg/response/static-service",
}
GOOD = {"type": "tool-service", "name": "good", "description": "Fine", "service": "static-service"}


# --- items 1 and 2: one bad item is one row; one status everywhere ---------------------------


@pytest.fixture
async def trustgraph_store(connection: Transport, settings: Settings) -> AsyncIterator[ConfigStoreService]:
    """The store as TrustGraph's: it takes any text for a `tool` item, so a bad one can be there."""
    store = ConfigStoreService.in_data_dir(connection, settings.data_dir, protocol="trustgraph")
    await store.start()
    yield store
    await store.stop()


@pytest.fixture
async def trustgraph_registry(connection: Transport, trustgraph_store: ConfigStoreService) -> AsyncIterator[Registry]:
    registry = Registry(connection, options=FAST)
    await registry.start()
    yield registry
    await registry.stop()


async def put(connection: Transport, items: list[tuple[str, str, str]]) -> None:
    client = await ConfigClient(connection, timeout=5).start()
    try:
        await client.put(items)
    finally:
        await client.close()


async def test_a_malformed_static_tool_on_a_trustgraph_store_is_one_unavailable_row_with_its_reason(
    tmp_path: Path, settings: Settings, connection: Transport, trustgraph_registry: Registry
) -> None:
    await put(
        connection,
        [
            ("tool-service", "static-service", json.dumps(SERVICE)),
            ("tool", "good", json.dumps(GOOD)),
            (
                "tool",
                "noname",
                json.dumps({"type": "tool-service", "description": "No name", "service": "static-service"}),
            ),
            ("tool", "notjson", "{this is not json"),
        ],
    )
    env = toolreg_env(settings.pulsar_url or "", tmp_path)
    listed = await atoolreg("tools", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert (rows["good"]["status"], rows["good"]["detail"]) == ("configured", "")
    assert (rows["noname"]["status"], rows["noname"]["service"]) == ("unavailable", "static-service")
    assert "name: Field required" in rows["noname"]["detail"]
    assert rows["notjson"]["status"] == "unavailable" and "not JSON" in rows["notjson"]["detail"]
    assert rows["notjson"]["service"] is None
    table = await atoolreg("tools", env=env)
    assert table.returncode == 0, table.stderr
    lines = {line.split()[0]: line for line in table.stdout.splitlines()[1:]}
    assert "unavailable" in lines["notjson"] and "not JSON" in lines["notjson"] and "configured" in lines["good"]


async def test_the_page_and_toolreg_tools_give_every_tool_the_same_status_and_reason(
    settings: Settings, connection: Transport, trustgraph_registry: Registry
) -> None:
    await put(
        connection,
        [
            ("tool-service", "static-service", json.dumps(SERVICE)),
            ("tool", "good", json.dumps(GOOD)),
            ("tool", "orphan", json.dumps({**GOOD, "name": "orphan", "service": "gone-service"})),
            ("tool", "notjson", "{"),
        ],
    )
    async with JokeService(settings=settings, ttl=5):
        await eventually(lambda: _has_announced(trustgraph_registry), timeout=5)
        cli = {t.name: (t.service, t.source, t.status, t.detail) for t in await trustgraph_registry.list_tools()}
        page = {
            t.name: (t.service, t.source, t.status, t.detail)
            for t in (await trustgraph_registry.overview.snapshot()).tools
        }
    assert page == cli
    assert cli["orphan"][2] == "unavailable" and "no tool-service/gone-service" in cli["orphan"][3]
    assert cli["tell-joke"][1:3] == ("announced", "live") and cli["good"][2] == "configured"


async def _has_announced(registry: Registry) -> bool:
    return any(t.source == "announced" for t in await registry.list_tools())


# --- item 5: timeouts that hold, and a word while waiting ------------------------------------


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """Something that accepts TCP connections on a broker URL and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield f"pulsar://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def refused_url() -> str:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now: a connection is refused
    return f"pulsar://127.0.0.1:{port}"


def on_a_terminal(
    args: list[str], env: dict[str, str], stdin_text: str | None = None, timeout: float = 60
) -> tuple[int, str, str, float]:
    """Run `toolreg args` with stderr (and, given `stdin_text`, stdin) on a pseudo-terminal: (code, stdout, stderr,
    seconds)."""
    err_master, err_slave = pty.openpty()
    said: list[bytes] = []

    def drain() -> None:  # read as it comes: a full terminal buffer would block the command
        while True:
            try:
                chunk = os.read(err_master, 65536)
            except OSError:  # the command has gone (EIO)
                return
            if not chunk:
                return
            said.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    in_master, in_slave = pty.openpty() if stdin_text is not None else (-1, -1)
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "discovery.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=err_slave,
        stdin=in_slave if stdin_text is not None else subprocess.DEVNULL,
    )
    os.close(err_slave)
    if stdin_text is not None:
        os.close(in_slave)
        time.sleep(1.0)  # let it start and say what it reads before the value is typed
        os.write(in_master, stdin_text.encode() + b"\n\x04")  # Ctrl-D at the start of a line: end of file
    out, _ = process.communicate(timeout=timeout)
    elapsed = time.monotonic() - started
    reader.join(5)
    os.close(err_master)
    if stdin_text is not None:
        os.close(in_master)
    return process.returncode, out.decode(), b"".join(said).decode().replace("\r\n", "\n"), elapsed


@pytest.mark.parametrize("command", [["tools"], ["config", "get", "tool/x"]], ids=["tools", "config-get"])
def test_timeout_covers_connecting_to_a_broker_that_is_not_there(command: list[str], tmp_path: Path) -> None:
    started = time.monotonic()
    done = toolreg(*command, "--timeout", "2", env=toolreg_env(refused_url(), tmp_path))
    assert time.monotonic() - started < 4.0, "was 11 s: pulsar-client retried for its own operation timeout"
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "cannot reach the broker" in done.stderr
    assert "waiting for" not in done.stderr, "off a terminal nothing is said while waiting"


@pytest.mark.parametrize("command", [["tools"], ["config", "get", "tool/x"]], ids=["tools", "config-get"])
def test_on_a_terminal_a_silent_broker_is_named_while_waiting_and_the_timeout_holds(
    command: list[str], tmp_path: Path, silent_broker: str
) -> None:
    code, out, said, elapsed = on_a_terminal([*command, "--timeout", "2"], toolreg_env(silent_broker, tmp_path))
    assert elapsed < 5.0, f"took {elapsed:.1f}s; pulsar-client alone waits 5 s to connect, then 10 s per operation"
    assert code == 1 and out == ""
    lines = said.strip().splitlines()
    assert lines[0].startswith(f"toolreg: waiting for the broker at {silent_broker}"), said
    assert "accepts connections but did not open" in lines[-1] and "within 2s" in lines[-1], said


class NoConsumer(DynamicToolService):
    """Wired by hand and never started: its tool is in the store, nobody reads its queue."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "nobody-home"}
    tools: ClassVar[list[dict[str, Any]]] = [{"name": "knock", "description": "Nobody answers"}]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return "never"


async def test_call_takes_a_timeout_and_names_the_service_it_waits_for(
    tmp_path: Path, settings: Settings, config_client: ConfigClient
) -> None:
    service = NoConsumer(settings=settings, announce=False)
    await config_client.put(
        [("tool-service", service.id, service.service_descriptor.to_json())]
        + [("tool", t.name, t.to_json()) for t in service.tool_descriptors]
    )
    env = toolreg_env(settings.pulsar_url or "", tmp_path)
    code, out, said, elapsed = await asyncio.to_thread(on_a_terminal, ["call", "knock", "--timeout", "2"], env)
    assert code == 1 and out == ""
    assert elapsed < 8.0, f"took {elapsed:.1f}s (was 32 s, the bridge's default)"
    assert "waiting for knock's service 'nobody-home' to answer on non-persistent://" in said, said
    assert (
        said.strip().splitlines()[-1]
        == "toolreg: knock: no answer from its service within 2s; is it running (toolreg serve ...)?"
    )


class Ticker(DynamicToolService):
    """Streams a progress line every 20 ms and never finishes."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "ticker"}
    tools: ClassVar[list[dict[str, Any]]] = [{"name": "tick", "description": "Never finishes"}]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> AsyncIterator[str]:
        while True:
            yield "tick\n"
            await asyncio.sleep(0.02)


async def test_call_of_an_endless_stream_says_it_was_still_streaming_at_its_deadline_not_that_nobody_answers(
    tmp_path: Path, settings: Settings, config_client: ConfigClient
) -> None:
    async with Ticker(settings=settings, announce=False) as service:
        await config_client.put(static_items(service))
        env = toolreg_env(settings.pulsar_url or "", tmp_path)
        done = await atoolreg("call", "tick", "--timeout", "2", env=env)
    assert done.returncode == 1 and done.stdout.startswith("tick\n"), done
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("toolreg: tick: the call exceeded its total deadline of 2s while still streaming progress (")
    assert " progress messages received on non-persistent://" in last and "is it running" not in last, last


# --- items 9 and 10: the call command ----------------------------------------------------------


class Acme(DynamicToolService):
    descriptor: ClassVar[dict[str, Any]] = {"id": "acme"}
    tools: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "acme.search",
            "description": "Search",
            "arguments": [{"name": "q", "type": "string", "description": "Query"}],
        },
        *({"name": f"filler-{i:02}", "description": "Filler"} for i in range(40)),
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return f"found {arguments.get('q', '')}"


async def test_call_accepts_the_mapped_name_prints_json_and_suggests_the_closest_names(
    tmp_path: Path, settings: Settings, config_client: ConfigClient
) -> None:
    async with Acme(settings=settings, announce=False) as acme:
        await config_client.put(
            [("tool-service", acme.id, acme.service_descriptor.to_json())]
            + [("tool", t.name, t.to_json()) for t in acme.tool_descriptors]
        )
        env = toolreg_env(settings.pulsar_url or "", tmp_path)
        mapped = await atoolreg("call", "acme_search", "q=cats", env=env)
        assert (mapped.returncode, mapped.stdout) == (0, "found cats\n"), mapped.stderr
        as_json = await atoolreg("call", "acme.search", "q=dogs", "--json", env=env)
        assert json.loads(as_json.stdout) == {
            "tool": "acme.search",
            "workspace": "default",
            "observation": "found dogs",
            "content": [{"type": "text", "text": "found dogs"}],
        }
        typo = await atoolreg("call", "acme.serch", env=env)
        assert typo.returncode == 1 and typo.stderr.count("\n") == 1
        assert "no tool 'acme.serch' in workspace 'default' (41 tool(s); did you mean acme.search" in typo.stderr
        assert "toolreg tools" in typo.stderr and "filler" not in typo.stderr
        near_many = await atoolreg("call", "filler-1", env=env)
        assert "did you mean filler-" in near_many.stderr and near_many.stderr.count("filler-") <= 6, (
            "a few close names, not every tool"
        )
        nothing_close = await atoolreg("call", "zzz", env=env)
        assert "no tool 'zzz' in workspace 'default' (41 tool(s)); `toolreg tools` lists them" in nothing_close.stderr


async def test_call_without_a_broker_names_the_flag_not_the_python_keyword(tmp_path: Path) -> None:
    done = await atoolreg("call", "tell-joke", env=toolreg_env(refused_url(), tmp_path))
    assert done.returncode == 1
    assert "--static-dir" in done.stderr and "static_dir" not in done.stderr, done.stderr


# --- item 9: conventions -------------------------------------------------------------------------


def test_version_comes_from_the_installed_distribution(tmp_path: Path) -> None:
    done = toolreg("--version", env=toolreg_env("", tmp_path))
    assert (done.returncode, done.stdout) == (0, f"toolreg {version('tool-discovery')}\n")


@pytest.mark.parametrize(
    "command",
    [["--help"], ["up"], ["serve"], ["config"], ["call"], ["tools"], ["conflicts"], ["rejections"], ["trust"]],
)
def test_the_main_commands_show_examples_in_their_help(command: list[str], tmp_path: Path) -> None:
    done = toolreg(*command, *([] if command == ["--help"] else ["--help"]), env=toolreg_env("", tmp_path))
    assert done.returncode == 0 and "\nexamples:\n  toolreg " in done.stdout, done.stdout


def test_no_color_turns_the_colours_of_console_logs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    def logged() -> str:
        out = Terminal()
        configure_logging("info", json=False, stream=out)
        get_logger("test.colour").warning("colour.check", what="x")
        return out.getvalue()

    try:
        monkeypatch.delenv("NO_COLOR", raising=False)
        assert "\x1b[" in logged()
        monkeypatch.setenv("NO_COLOR", "1")
        plain = logged()
        assert "colour.check" in plain and "\x1b[" not in plain
    finally:
        configure_logging("warning", json=True)  # as conftest set it
        logging.getLogger("test.colour").handlers.clear()


async def test_config_list_and_trust_list_print_json(
    tmp_path: Path, settings: Settings, config_client: ConfigClient
) -> None:
    await config_client.put(
        [
            ("tool-service", "static-service", json.dumps(SERVICE)),
            ("tool-service", "other", json.dumps({**SERVICE, "id": "other"})),
        ]
    )
    env = toolreg_env(settings.pulsar_url or "", tmp_path)
    listed = await atoolreg("config", "list", "tool-service", "--json", env=env)
    assert json.loads(listed.stdout) == ["other", "static-service"]
    policy = str(tmp_path / "trust.json")
    assert (await atoolreg("keygen", str(tmp_path / "k.key"), env=env)).returncode == 0
    added = await atoolreg(
        "trust",
        "add",
        "team",
        "--public-key",
        str(tmp_path / "k.key.pub"),
        "--services",
        "joke-*",
        "--tools",
        "tell-*",
        "--policy",
        policy,
        env=env,
    )
    assert added.returncode == 0, added.stderr
    keys = json.loads((await atoolreg("trust", "list", "--policy", policy, "--json", env=env)).stdout)
    assert [(k["name"], k["services"], k["tools"]) for k in keys] == [("team", ["joke-*"], ["tell-*"])]
    assert keys[0]["public_key"] == (tmp_path / "k.key.pub").read_text().strip() and keys[0]["id"]


async def test_conflicts_take_a_workspace(
    tmp_path: Path, settings: Settings, connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    await config_client.put(
        [
            (
                "tool",
                "tell-joke",
                ToolDescriptor(name="tell-joke", description="By hand", service="joke-service").to_json(),
            )
        ]
    )
    env = toolreg_env(settings.pulsar_url or "", tmp_path)
    async with JokeService(settings=settings, ttl=5):
        await eventually(lambda: registry.conflicts(), timeout=5)
        here = await atoolreg("conflicts", "--workspace", "default", "--json", env=env)
        assert [c["tool"] for c in json.loads(here.stdout)] == ["tell-joke"], here.stderr
        elsewhere = await atoolreg("conflicts", "--workspace", "research", env=env)
        assert elsewhere.stdout.strip() == "no conflicts in workspace 'research'"


# --- item 10: config put on a terminal says it is reading stdin ---------------------------------


async def test_config_put_on_a_terminal_says_it_reads_stdin(
    tmp_path: Path, settings: Settings, config_client: ConfigClient
) -> None:
    env = toolreg_env(settings.pulsar_url or "", tmp_path)
    code, out, said, _ = await asyncio.to_thread(
        on_a_terminal, ["config", "put", "tool-service/static-service"], env, json.dumps(SERVICE)
    )
    assert said.startswith("toolreg: reading the value from stdin; end with Ctrl-D"), said
    assert code == 0 and "stored" in out, said
    assert (
        json.loads((await config_client.get([("tool-service", "static-service")]))[("tool-service", "static-service")])
        == SERVICE
    )

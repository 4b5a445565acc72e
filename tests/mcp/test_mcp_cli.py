"""`toolreg mcp` when it cannot serve: every failure at start is one line on stderr and exit code 1,
quickly, with nothing on stdout (an MCP client would read it as protocol), and never a hang, even
while the client holds stdin open as MCP clients do."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import toolreg_env

from discovery.broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[2]


def start_mcp(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `toolreg mcp ARGS` with stdin held open (as an MCP client does) until it exits by itself."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "discovery.cli", "mcp", *args],
        env=env,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("toolreg mcp hung instead of failing") from None
    out, err = process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), time.monotonic() - started


def assert_one_line_failure(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout == ""
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("toolreg: ")]
    assert len(ours) == 1, done.stderr[-2000:]
    for fragment in fragments:
        assert fragment in ours[0], ours[0]


@pytest.fixture
def no_broker_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    env.update(TOOLREG_DATA_DIR=str(tmp_path / "nothing-here"), TOOLREG_LOG_FORMAT="json")
    return env


def test_no_broker_configured(no_broker_env: dict[str, str]) -> None:
    done, took = start_mcp(env=no_broker_env)
    assert_one_line_failure(done, "no broker", "toolreg up")
    assert took < 15


@pytest.mark.parametrize("transport", [[], ["--http", "127.0.0.1:0"]])
def test_nothing_listening_at_the_broker_url(transport: list[str], tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    done, took = start_mcp(*transport, env=toolreg_env(f"pulsar://127.0.0.1:{port}", tmp_path))
    assert_one_line_failure(done, "cannot reach the broker", f"127.0.0.1:{port}")
    assert took < 15


@pytest.fixture
def mute_listener() -> Iterator[int]:
    """A port that accepts connections and never speaks: a broken broker, not an absent one."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_broker_that_does_not_answer(mute_listener: int, tmp_path: Path) -> None:
    done, took = start_mcp(env=toolreg_env(f"pulsar://127.0.0.1:{mute_listener}", tmp_path))
    assert_one_line_failure(done, "config store did not answer")
    assert took < 25


def test_a_broker_without_a_config_store(broker: EmbeddedBroker, tmp_path: Path) -> None:
    done, took = start_mcp(env=toolreg_env(broker.url, tmp_path))
    # The flag the user passes, not the bridge's Python keyword (the same words as `toolreg call`'s).
    assert_one_line_failure(
        done, "config store did not answer", "toolreg up", "no --static-dir given", "pass --static-dir <dir"
    )
    assert "static_dir" not in done.stderr
    assert took < 25


def test_bad_options_are_one_line_too(broker: EmbeddedBroker, tmp_path: Path) -> None:
    env = toolreg_env(broker.url, tmp_path)
    assert_one_line_failure(start_mcp("--http", "localhost", env=env)[0], "HOST:PORT")
    assert_one_line_failure(start_mcp("--workspace", "two words", env=env)[0], "--workspace", "must match")
    assert_one_line_failure(
        start_mcp("--http", "127.0.0.1:1", "--token-file", str(tmp_path / "absent"), env=env)[0], "--token-file"
    )
    (tmp_path / "empty").write_text("\n")
    assert_one_line_failure(
        start_mcp("--http", "127.0.0.1:1", "--token-file", str(tmp_path / "empty"), env=env)[0], "is empty"
    )


async def test_a_taken_http_port(broker: EmbeddedBroker, config_store: object, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        # In a thread: the config store it reads first answers from this test's event loop.
        done, _ = await asyncio.to_thread(
            start_mcp, "--http", f"127.0.0.1:{port}", env=toolreg_env(broker.url, tmp_path)
        )
    assert_one_line_failure(done, f"cannot listen on 127.0.0.1:{port}")
    assert "mcp.serving" not in done.stderr  # it binds first, then says it serves
    assert "mcp.client" not in done.stderr and done.stderr.count("toolreg: ") == 1


async def test_it_says_it_serves_over_http_once_the_port_is_bound(
    broker: EmbeddedBroker, config_store: object, tmp_path: Path
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "discovery.cli",
        "mcp",
        "--http",
        "127.0.0.1:0",
        env=toolreg_env(broker.url, tmp_path),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert line.startswith("mcp ") and "/mcp" in line, line
        endpoint = line.split()[1]
    finally:
        process.terminate()
        _, err = await asyncio.wait_for(process.communicate(), 30)
    serving = [line for line in err.decode().splitlines() if '"mcp.serving"' in line]
    assert len(serving) == 1 and endpoint in serving[0] and '"transport": "http"' in serving[0], err.decode()[-2000:]

"""Start-up cannot leak: a failure at any step of `toolreg up` or `ToolSet.start` undoes the steps before it.

The error reaches the caller as one line, no client thread, task or broker
process is left behind, and `toolreg up` exits with status 1 (never an abort).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import toolreg_env
from support.faults import STEPS

import agent_bridge.reload as reload_module
import agent_bridge.toolset as toolset_module
from agent_bridge import BridgeUnavailable, ToolSet
from discovery.broker import EmbeddedBroker
from toolservice_base import BrokerUnreachable, ConfigClient, Settings, TransportError, open_transport

HERE = Path(__file__).parent
IDLE_THREADS = 2
"""The main thread and the one pulsar-client keeps for the process once any client was closed (measured)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.parametrize("step", STEPS)
def test_toolreg_up_fails_in_one_line_and_leaves_nothing_behind(step: str, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    env.update(
        TOOLREG_DATA_DIR=str(data_dir),
        TOOLREG_LOG_LEVEL="error",
        PYTHONPATH=str(HERE) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    done = subprocess.run(
        [sys.executable, str(HERE.parent / "support" / "faults.py"), step, str(report), "--", "up"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])  # 1, not a signal (abort is -6)
    errors = [line for line in done.stderr.splitlines() if line.startswith("toolreg:")]
    assert len(errors) == 1 and "injected" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    found = json.loads(report.read_text())
    assert found["status"] == 1 and found["tasks"] == 0
    assert found["threads"] <= IDLE_THREADS, f"{found['threads']} OS threads left after a failed start at {step!r}"
    pid_file = data_dir / "broker.pid"
    if pid_file.exists():
        assert not _pid_alive(int(pid_file.read_text().strip())), "the embedded broker outlived the failed start"


def test_toolreg_up_on_a_broker_that_refuses_us_fails_in_one_line(tmp_path: Path) -> None:
    env = toolreg_env("pulsar://127.0.0.1:1", tmp_path / "data", TOOLREG_LOG_LEVEL="error")
    done = subprocess.run(
        [sys.executable, "-m", "discovery.cli", "up"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("toolreg: ") and "127.0.0.1:1" in lines[-1] and "Traceback" not in done.stderr


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _other_tasks() -> set[asyncio.Task[Any]]:
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


async def _fails_cleanly(toolset: ToolSet, expected: type[Exception], baseline: int) -> str:
    with pytest.raises(expected) as caught:
        await toolset.start()
    await asyncio.sleep(0.1)  # let cancelled tasks finish unwinding
    assert not _other_tasks(), f"tasks left: {_other_tasks()}"
    assert _threads() <= baseline, f"{_threads()} OS threads after the failed start (baseline {baseline})"
    message = str(caught.value)
    assert "\n" not in message
    return message


async def test_toolset_start_failures_undo_every_step(
    broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=tmp_path / "data", pulsar_url=broker.url, broker="pulsar-lite")
    transport = await open_transport(settings)  # one clean open and close: pulsar-client's idle threads exist now
    await transport.close()
    baseline = max(_threads(), IDLE_THREADS)  # its idle thread may still be starting when counted

    # 1. the transport cannot be opened
    async def no_transport(*args: Any, **kwargs: Any) -> Any:
        raise BrokerUnreachable("cannot reach the broker at pulsar://nowhere:1 (injected)")

    monkeypatch.setattr(toolset_module, "open_transport", no_transport)
    message = await _fails_cleanly(ToolSet(settings=settings), BrokerUnreachable, baseline)
    assert "injected" in message
    monkeypatch.undo()

    # 2. the config watch cannot subscribe (after the transport and the config client exist)
    async def no_watch(*args: Any, **kwargs: Any) -> Any:
        raise TransportError("injected: subscribe refused")

    monkeypatch.setattr(reload_module, "watch_config", no_watch)
    message = await _fails_cleanly(ToolSet(settings=settings, store_timeout=1), BridgeUnavailable, baseline)
    assert "injected: subscribe refused" in message and "toolreg up" in message
    monkeypatch.undo()

    # 3. the first read fails outright with something that is not a store error
    async def broken_read(self: ConfigClient, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected: a bug in the first read")

    monkeypatch.setattr(ConfigClient, "read_types", broken_read)
    message = await _fails_cleanly(ToolSet(settings=settings, store_timeout=1), RuntimeError, baseline)
    assert "injected" in message

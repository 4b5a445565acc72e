"""Mistakes a user makes at the command line end in one line that says what happened, never a traceback."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from support import atoolreg, toolreg_env

from discovery.broker import EmbeddedBroker


async def test_a_key_too_long_for_the_store_is_refused_in_one_line(
    tmp_path: Path, broker: EmbeddedBroker, config_store
) -> None:  # noqa: ANN001
    env = toolreg_env(broker.url, tmp_path)
    done = await atoolreg("config", "put", "note/" + "k" * 10_000, "--value", "{}", env=env)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("toolreg: refused before sending: ")
    assert "key: String should have at most 512 characters" in done.stderr
    assert "Traceback" not in done.stderr and "pydantic" not in done.stderr


async def test_a_broker_that_is_not_there_is_named_not_the_config_store(tmp_path: Path) -> None:
    env = toolreg_env("pulsar://127.0.0.1:1", tmp_path)
    done = await atoolreg("call", "tell-joke", "topic=cats", env=env, timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("toolreg: cannot reach the broker at pulsar://127.0.0.1:1") and "PULSAR_URL" in last
    assert "Traceback" not in done.stderr


async def test_output_cut_short_by_the_reader_is_not_an_error(
    tmp_path: Path, broker: EmbeddedBroker, config_store
) -> None:  # noqa: ANN001
    env = toolreg_env(broker.url, tmp_path)
    big = '{"text": "' + "x" * 300_000 + '"}'
    assert (await atoolreg("config", "put", "note/big", env=env, input=big)).returncode == 0
    # `toolreg config get note/big | head -c 10`: the reader leaves after 10 bytes.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "discovery.cli",
        "config",
        "get",
        "note/big",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert len(await proc.stdout.read(10)) == 10
    proc.stdout.feed_eof()
    transport = proc._transport  # type: ignore[attr-defined]
    transport.get_pipe_transport(1).close()  # the read end of the pipe goes away, as when `head` exits
    stderr = await asyncio.wait_for(proc.stderr.read(), 60)
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr

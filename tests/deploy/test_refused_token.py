"""A wrong or missing token is said the same way by every command, within moments of the broker's refusal.

Apache Pulsar (the run's, authentication on) refuses a token not signed with
its key, and a connection without one, at the handshake, in milliseconds;
pulsar-client retries either until its operation timeout and says "Timeout".
Each command here must print the one refusal line (naming the role the token
claims, or that none was sent), not a guess about an overloaded broker or a
config store to start, and exit within 2 s of opening its broker connection
(its `transport.opened` event: the handshake the broker refuses goes out
then).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from support import atoolreg, toolreg_env

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(420)]

MARGIN = 2.0
"""Seconds from opening the broker connection to the command's exit."""

COMMANDS = {
    "tools": ["tools"],
    "call": ["call", "tell-joke", "topic=cats"],
    "config list": ["config", "list", "tool"],
    "serve": ["serve", "toolservice_base.examples.joke:JokeService"],
    "up": ["up"],
}


async def timed(args: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Run a command with its debug events on; seconds from its first `transport.opened` to its exit."""
    done = await atoolreg(*args, "--log-level", "debug", env=env, timeout=60)
    ended = time.time()
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    opened = next(e for e in events if e["event"] == "transport.opened")
    at = datetime.fromisoformat(opened["timestamp"].replace("Z", "+00:00")).timestamp()
    return ended - at, done.returncode, done.stderr


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("which", ["wrong", "missing"])
async def test_every_command_says_the_broker_refused_the_token_at_once(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path, command: str, which: str
) -> None:
    key = tmp_path / "other.key"
    key.write_bytes(os.urandom(32))
    token = {"PULSAR_AUTH_TOKEN": apache_pulsar.mint_token("intruder", secret_key=key)} if which == "wrong" else {}
    env = toolreg_env(
        apache_pulsar.url, tmp_path / "data", TOOLREG_BROKER="apache-pulsar", TOOLREG_TOPICSPACE=tenant, **token
    )
    took, code, said = await timed(COMMANDS[command], env)
    lines = [line for line in said.splitlines() if line.startswith("toolreg: ")]
    assert code == 1 and len(lines) == 1, said
    [line] = lines
    assert f"toolreg: the broker at {apache_pulsar.url} refused the token in PULSAR_AUTH_TOKEN" in line, line
    assert ("(role intruder;" if which == "wrong" else "(none set, so no role;") in line, line
    assert "overloaded" not in line and "toolreg up" not in line and "config store" not in line, line
    print(f"{command} ({which} token): exits {took:.2f}s after opening its connection", file=sys.stderr)
    assert took < MARGIN, f"{command}: {took:.1f}s"

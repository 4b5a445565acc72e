"""Which event loop a `toolreg` process runs on: uvloop where it is installed, asyncio on request, one line for
nonsense.

pulsar.asyncio completes its futures from the client's C++ threads through
`call_soon_threadsafe`; a round trip through the config store on uvloop is
the proof that this still works there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import atoolreg, toolreg, toolreg_env

from discovery.broker import EmbeddedBroker
from discovery.store.service import ConfigStoreService

SERVICE = {
    "id": "loop-service",
    "request-queue": "non-persistent://tg/request/loop",
    "response-queue": "non-persistent://tg/response/loop",
}

pytest.importorskip(
    "uvloop", reason="uvloop is in the test extra; this checks the loop toolreg picks when it is installed"
)


def _loop_of(stderr: str) -> str | None:
    for line in stderr.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == "toolreg.event_loop":
            return str(entry["loop"])
    return None


@pytest.mark.parametrize("asked, expected", [(None, "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")])
async def test_config_round_trips_on_the_loop_asked_for_and_on_uvloop_when_nothing_is_asked(
    tmp_path: Path, broker: EmbeddedBroker, config_store: ConfigStoreService, asked: str | None, expected: str
) -> None:
    extra = {"TOOLREG_LOG_LEVEL": "debug", **({"TOOLREG_EVENT_LOOP": asked} if asked else {})}
    env = toolreg_env(broker.url or "", tmp_path, **extra)
    put = await atoolreg("config", "put", "tool-service/loop-service", env=env, input=json.dumps(SERVICE))
    got = await atoolreg("config", "get", "tool-service/loop-service", env=env)
    assert put.returncode == 0 and got.returncode == 0, put.stderr + got.stderr
    assert json.loads(got.stdout) == SERVICE
    assert (_loop_of(put.stderr), _loop_of(got.stderr)) == (expected, expected)


def test_an_unknown_event_loop_is_one_line_naming_the_choices(tmp_path: Path) -> None:
    result = toolreg(
        "config", "list", "tool", env=toolreg_env("pulsar://127.0.0.1:1", tmp_path, TOOLREG_EVENT_LOOP="trio")
    )
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "TOOLREG_EVENT_LOOP='trio'" in result.stderr and "uvloop or asyncio" in result.stderr

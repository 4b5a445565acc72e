"""What `toolreg announce --mcp` cannot announce, it refuses before announcing anything, in one line.

A server that never finishes its handshake, one that lists 10,000 tools, one with a 10 MB schema, one whose
tools would exceed the registry's 64 KiB announcement, two tool names that map to one, and an HTTP endpoint that
answers 401 (the official SDK's `bearer_auth` story): each stops the sidecar with exit code 1 and one line on
stderr saying what is wrong and what to do; the registry hears nothing. A tool name that is not a name here is
mapped, not refused. Cost: about 15 s, pulsar-lite only (what is refused is decided before the broker matters).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support.mcp_sidecar import free_port, http_story, refused, sidecar

from agent_bridge import ToolSet
from discovery.registry.service import Registry
from toolservice_base import ConfigClient, Settings

HOSTILE = [sys.executable, str(Path(__file__).with_name("hostile_server.py"))]

CASES = {
    "never-initializes": (
        ["--mcp-timeout", "1", "--mcp", "--", *HOSTILE, "silent"],
        "did not finish its handshake (initialize) within 1 s",
    ),
    "10,000 tools": (["--mcp", "--", *HOSTILE, "many", "10000"], "lists more than 4096 tools"),
    "a 10 MB schema": (
        ["--mcp", "--", *HOSTILE, "big-schema", "10000000"],
        "tool 'big' of the MCP server cannot be announced: input-schema",
    ),
    "over 64 KiB": (
        ["--mcp", "--", *HOSTILE, "many", "100", "1000"],
        "the MCP server's 100 tools make an announcement larger than the registry's 64 KiB limit; announce part",
    ),
    "two names, one mapping": (
        ["--mcp", "--", *HOSTILE, "names", "a b", "a_b"],
        "MCP tools 'a b' and 'a_b' would both be announced as 'a_b'",
    ),
}


@pytest.mark.parametrize("case", CASES)
async def test_a_server_that_cannot_be_announced_is_refused_in_one_line_and_nothing_is_announced(
    case: str, settings: Settings, registry: Registry, config_client: ConfigClient, tmp_path: Path
) -> None:
    args, expected = CASES[case]
    code, out, err = await refused(settings, tmp_path / "sidecar.log", *args)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("toolreg: ") and expected in err, err
    assert await config_client.list("tool") == []
    assert registry.rejections() == []


async def test_an_endpoint_that_answers_401_is_refused_saying_so(
    settings: Settings, registry: Registry, config_client: ConfigClient, tmp_path: Path
) -> None:
    port = free_port()
    async with http_story("bearer_auth", port, tmp_path / "story.log"):
        code, out, err = await refused(settings, tmp_path / "sidecar.log", "--mcp-url", f"http://127.0.0.1:{port}/mcp")
        assert code == 1 and out == "" and err.count("\n") == 1, err
        assert "answered HTTP 401 Unauthorized" in err and "--header, say 'Authorization=Bearer TOKEN'" in err
        async with sidecar(  # with the story's own token it joins
            settings,
            tmp_path / "ok.log",
            "--mcp-url",
            f"http://127.0.0.1:{port}/mcp",
            "--header",
            "Authorization=Bearer demo-token",
        ) as car:
            assert car.said.startswith("announcing bearer-auth-example (whoami) ")
    assert await config_client.list("tool") == []


async def test_a_name_that_is_no_tool_name_here_is_mapped_and_called_by_its_own(
    settings: Settings, registry: Registry, tmp_path: Path
) -> None:
    names = ["get weather", "files/read", "ok.name-1", "x" * 200]
    async with sidecar(settings, tmp_path / "sidecar.log", "--mcp", "--", *HOSTILE, "names", *names):
        async with ToolSet(settings=settings, data_dir=tmp_path / "agent") as tools:
            long = await _long_name(tools)
            await tools.wait_for(lambda t: {"get_weather", "files_read", "ok.name-1"} <= set(t.names()), timeout=15)
            described = {spec["name"]: spec for spec in tools.describe()}
            assert described["get_weather"]["title"] == "get weather"  # what the server calls it, for people
            assert "title" not in described["ok.name-1"]
            assert await tools.invoke("files_read", {"text": "x"}) == "files/read {'text': 'x'}"
            assert len(long) == 128 and long.startswith("x" * 100)


async def _long_name(tools: ToolSet) -> str:
    await tools.wait_for(lambda t: any(name.startswith("xxx") for name in t.names()), timeout=15)
    return next(name for name in tools.names() if name.startswith("xxx"))

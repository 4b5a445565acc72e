"""`toolreg mcp --http` refuses requests another site could make through DNS rebinding, on every bind.

The MCP specification asks every streamable HTTP server to check `Host` and `Origin`; the SDK does it
only when bound to the literal 127.0.0.1, localhost or ::1, so `--http 127.0.0.2:8765` (or any other
address) answered a page on any site whose name resolves there. The checks are the server's own now,
in front of the token and of the SDK, compared as parsed names and ports, never as text prefixes.

No broker is needed for what is refused before MCP sees it: most tests serve an unstarted `ToolSet`
in the test's loop; one runs the command as an operator would.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import httpx2
import pytest
from support import toolreg_env

from agent_bridge import ToolSet
from discovery.broker import EmbeddedBroker
from discovery.mcp.server import McpFront
from discovery.mcp.transports import MAX_VERDICTS, HostOriginGuard, http_server
from discovery.store.service import ConfigStoreService
from toolservice_base import Settings

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
    }
)

Serve = Callable[..., AbstractAsyncContextManager[str]]


@pytest.fixture
def serve(tmp_path: Path) -> Serve:
    """`serve(host, **options)`: `http_server` for a ToolSet that never connects (nothing here reaches a tool)."""

    def opened(host: str, **options: object) -> AbstractAsyncContextManager[str]:
        tools = ToolSet(settings=Settings(data_dir=tmp_path / "data", pulsar_url="pulsar://127.0.0.1:9"))
        return http_server(McpFront(tools), host, 0, **options)  # type: ignore[arg-type]

    return opened


async def post(url: str, headers: dict[str, str]) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(url, content=INITIALIZE, headers={**ACCEPT, **headers})


def _refused(response: httpx2.Response, header: str) -> bool:
    body = response.text
    return (
        response.status_code == 403
        and body.count("\n") == 1
        and header in json.loads(body)["error_description"]
        and "protocolVersion" not in body
    )


@pytest.mark.parametrize("bind", ["127.0.0.1", "127.0.0.2", "::1"])
async def test_host_and_origin_are_checked_on_every_loopback_bind(serve: Serve, bind: str) -> None:
    async with serve(bind) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        shown = f"[{bind}]" if ":" in bind else bind
        for host in (f"{shown}:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
            allowed = await post(url, {"Host": host})
            assert allowed.status_code == 200 and "protocolVersion" in allowed.text, (
                host,
                allowed.status_code,
                allowed.text,
            )
        for host in (
            f"attacker.example:{port}",
            f"{bind}.attacker.example:{port}",  # starts like the address: a text-prefix check let it in
            f"localhost.attacker.example:{port}",
            f"{shown}:{port + 1}",  # another port is another origin
            f"{shown}",  # no port: port 80
            f"{shown}:{port}@attacker.example",
            "",
        ):
            refused = await post(url, {"Host": host})
            assert _refused(refused, "Host"), (host, refused.status_code, refused.text)
        for origin in (
            "http://attacker.example",
            f"http://{bind}.attacker.example:{port}",
            "null",
            f"http://{shown}:{port + 1}",
            f"file://{shown}:{port}",
        ):
            refused = await post(url, {"Host": f"{shown}:{port}", "Origin": origin})
            assert _refused(refused, "Origin"), (origin, refused.status_code, refused.text)
        for origin in (f"http://{shown}:{port}", f"http://localhost:{port}"):
            allowed = await post(url, {"Host": f"{shown}:{port}", "Origin": origin})
            assert allowed.status_code == 200, (origin, allowed.text)


async def test_off_loopback_only_the_bound_address_and_the_names_allowed_pass(serve: Serve) -> None:
    async with serve("0.0.0.0", allowed_hosts=["mcp.internal.example"]) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        local = f"http://127.0.0.1:{port}/mcp"
        for host in (f"127.0.0.1:{port}", f"mcp.internal.example:{port}", f"MCP.internal.example:{port}"):
            assert (await post(local, {"Host": host})).status_code == 200, host
        for host in (f"attacker.example:{port}", f"mcp.internal.example.attacker.example:{port}", f"localhost:{port}"):
            assert _refused(await post(local, {"Host": host}), "Host"), host
        assert _refused(
            await post(local, {"Host": f"127.0.0.1:{port}", "Origin": "https://attacker.example"}), "Origin"
        )


async def test_the_host_is_checked_before_the_token(serve: Serve) -> None:
    async with serve("127.0.0.2", token="s3cret") as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert _refused(await post(url, {"Host": f"attacker.example:{port}", "Authorization": "Bearer s3cret"}), "Host")
        assert (await post(url, {"Host": f"127.0.0.2:{port}"})).status_code == 401
        assert (await post(url, {"Host": f"127.0.0.2:{port}", "Authorization": "Bearer s3cret"})).status_code == 200


@pytest.fixture
async def command_on_127_0_0_2(
    broker: EmbeddedBroker, config_store: ConfigStoreService, tmp_path: Path
) -> AsyncIterator[str]:
    """`toolreg mcp --http 127.0.0.2:0` as an operator starts it; the URL it printed."""
    with open(tmp_path / "mcp.log", "ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "discovery.cli",
            "mcp",
            "--http",
            "127.0.0.2:0",
            env=toolreg_env(broker.url, tmp_path / "mcp"),
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    assert process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert line.startswith("mcp "), line
        yield line.split()[1]
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0


async def test_toolreg_mcp_on_127_0_0_2_refuses_another_sites_host_and_origin(command_on_127_0_0_2: str) -> None:
    url = command_on_127_0_0_2
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert _refused(await post(url, {"Host": f"attacker.example:{port}"}), "Host")
    assert _refused(await post(url, {"Host": f"127.0.0.2:{port}", "Origin": "http://attacker.example"}), "Origin")
    allowed = await post(url, {})
    assert allowed.status_code == 200 and "protocolVersion" in allowed.text


def test_a_verdict_kept_for_a_host_and_origin_is_the_same_as_judging_them_again() -> None:
    """The guard keeps its verdict per (Host, Origin) as sent; asked again, past the pairs it keeps, or with a header
    too long to keep, it answers as it did the first time."""
    guard = HostOriginGuard(None, "127.0.0.1", 8765)  # type: ignore[arg-type]  # the app is never reached here

    def verdict(host: bytes, origin: bytes | None = None) -> str | None:
        headers = [(b"accept", b"*/*"), (b"host", host)] + ([(b"origin", origin)] if origin is not None else [])
        return guard.refusal({"type": "http", "headers": headers})

    pairs: list[tuple[bytes, bytes | None]] = [
        (b"127.0.0.1:8765", None),
        (b"localhost:8765", b"http://localhost:8765"),
        (b"127.0.0.1:8765", b"http://attacker.example"),
        (b"attacker.example:8765", None),
        (b"127.0.0.1:8765", b"http://127.0.0.1:8766"),
        (b"127.0.0.1:8765", b"http://x" + b"y" * 600 + b":8765"),  # too long to keep
    ]
    first = [verdict(*pair) for pair in pairs]
    assert first[0] is None and first[1] is None
    assert all(reason is not None for reason in first[2:])
    assert [verdict(*pair) for pair in pairs] == first
    for n in range(MAX_VERDICTS + 10):  # more pairs than are kept: the kept ones are emptied, never wrong
        assert verdict(f"attacker{n}.example:8765".encode()) is not None
    assert [verdict(*pair) for pair in pairs] == first

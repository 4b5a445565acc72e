"""`python scripts/oauth_server.py serve`: a local authorization server in one command, printing the issuer, a
client and how to get a token; the token it gives is one the MCP front's OAuth check accepts."""

from __future__ import annotations

import base64
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp.server.auth.provider import AccessToken

from discovery.mcp.auth import OAuthSettings, resource_server
from discovery.mcp.settings import TOKEN_ALGORITHMS

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "oauth_server.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def served() -> Iterator[tuple[int, str, dict[str, str]]]:
    """The command as a newcomer runs it: its port, the front's URL it was given, and the first four lines it
    printed (by their labels); stopped as Ctrl-C would, and it must exit cleanly."""
    port, front = free_port(), f"http://127.0.0.1:{free_port()}/mcp"
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "serve", "--port", str(port), "--resource", front],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(4)]
        yield port, front, dict(line.split(":", 1) for line in lines)
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(15) == 0


@pytest.mark.timeout(180)  # the first use installs oidc-provider and Node.js into the cache
async def test_serve_prints_the_issuer_a_client_and_how_to_get_a_token_the_front_accepts(
    served: tuple[int, str, dict[str, str]],
) -> None:
    port, front, said = served
    issuer = said["issuer"].strip()
    assert issuer == f"http://127.0.0.1:{port}"
    assert said["client"].strip().startswith("agent, secret ")
    assert f"--resource {front} --oauth-issuer {issuer}" in said["front"]
    curl = shlex.split(said["token"].strip())  # curl -s -u ID:SECRET -d ... URL: asked here as curl would
    user = curl[curl.index("-u") + 1]
    form = dict(curl[i + 1].split("=", 1) for i, word in enumerate(curl) if word == "-d")
    async with httpx2.AsyncClient(timeout=10) as http:
        answer = await http.post(
            curl[-1], data=form, headers={"Authorization": "Basic " + base64.b64encode(user.encode()).decode()}
        )
    assert answer.status_code == 200, answer.text
    access = answer.json()["access_token"]
    settings = OAuthSettings(issuer=issuer, algorithms=TOKEN_ALGORITHMS)
    async with resource_server(settings, front) as server:
        checked = await server.checker.check(access)
    assert isinstance(checked, AccessToken), checked
    assert checked.client_id == "agent" and checked.scopes == ["mcp"]

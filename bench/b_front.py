"""13. The MCP front over streamable HTTP: `toolreg mcp --http` in front of an echo service on the bus, against a
bare streamable-HTTP server of the official SDK with the same tool, driven by the same SDK client, same run; and the
same front as an OAuth 2.1 resource server, each call carrying an access token it checks.

Ours: `toolreg mcp --http 127.0.0.1:PORT` in a process of its own, an echo service (`bench.serve`) in another;
each `tools/call` crosses the front, the broker and the service and back. With OAuth: a second front, `--oauth-issuer`
an authorization server nobody here wrote (panva's oidc-provider, `scripts/oauth_server.py`), called with a JWT
access token for its resource URI got once by client credentials. Reference: `bench.front_reference`, the SDK's
low-level `Server` answering `echo` from memory in a process of its own, no authentication. The client is the SDK's
`Client` (streamable HTTP, the protocol it negotiates) in this process: sequential calls in interleaved rounds (p50,
p99), then calls/s with `SESSIONS` sessions each keeping `IN_FLIGHT` calls going, in interleaved bursts (the median
burst of each). The difference is the price of the front: its guards, the audit record, the bus round trip and the
service (and with OAuth, each request's token checked). Under `--profile DIR`, an extra, untimed burst of each path
with py-spy on its server process: `front-front.txt`, `front-oauth.txt`, `front-reference.txt`.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from .common import CpuPerCall, Progress, Stack, Workdirs, free_port, profiling, sampled, spawn, summary_ms

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from oauth_server import AuthorizationServer  # noqa: E402  (scripts/ is not a package)

NAME = "front"
ROUNDS = 5
SESSIONS = 4
IN_FLIGHT = 8
TEXT = "hello"
RATE_TARGET = 0.9
"""calls/s through the front at least this share of the bare SDK server's."""
OAUTH_RATE_TARGET = 0.8
"""calls/s through the front with OAuth on at least this share of the bare SDK server's."""
CLIENT_ID = "bench-agent"
SECRET = "bench secret"

Connect = Callable[[], Client]


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    count = 100 if quick else 500
    burst = 400 if quick else 4000
    stack = Stack(work.make(NAME)).start()
    issuer = AuthorizationServer(
        {
            "clients": [
                {
                    "client_id": CLIENT_ID,
                    "client_secret": SECRET,
                    "grant_types": ["client_credentials"],
                    "redirect_uris": [],
                    "response_types": [],
                    "token_endpoint_auth_method": "client_secret_basic",
                }
            ],
            "grants": {CLIENT_ID: "mcp"},
            "ttl": {CLIENT_ID: 3600},
        },
        log=stack.workdir / "oauth.log",
    )
    try:
        issuer.start()
        stack.processes["echo"] = spawn(["-m", "bench.serve", "--id", "echo"], stack.env(), stack.workdir / "echo.log")
        front_port, oauth_port, reference_port = free_port(), free_port(), free_port()
        stack.processes["front"] = spawn(
            ["-m", "discovery.cli", "mcp", "--http", f"127.0.0.1:{front_port}"], stack.env(), stack.workdir / "mcp.log"
        )
        oauth_url = f"http://127.0.0.1:{oauth_port}/mcp"
        stack.processes["oauth-front"] = spawn(
            ["-m", "discovery.cli", "mcp", "--http", f"127.0.0.1:{oauth_port}"]
            + ["--resource", oauth_url, "--oauth-issuer", issuer.issuer],
            stack.env(),
            stack.workdir / "mcp-oauth.log",
        )
        stack.processes["reference"] = spawn(
            ["-m", "bench.front_reference", "--port", str(reference_port)], stack.env(), stack.workdir / "ref.log"
        )
        token = await _token(issuer.issuer, oauth_url)
        paths: dict[str, Connect] = {
            "front": _connect(f"http://127.0.0.1:{front_port}/mcp"),
            "oauth": _connect(oauth_url, token),
            "reference": _connect(f"http://127.0.0.1:{reference_port}/mcp"),
        }
        for connect in paths.values():
            await _until_listed(connect)
        samples: dict[str, list[float]] = {name: [] for name in paths}
        async with paths["front"]() as front, paths["oauth"]() as oauth, paths["reference"]() as reference:
            clients = {"front": front, "oauth": oauth, "reference": reference}
            for client in clients.values():
                await _sequential(client, 20)  # warm-up, each
            for number in range(1, ROUNDS + 1):
                progress.update(f"round {number}/{ROUNDS}: the front, with OAuth, the bare SDK server", force=True)
                for name, client in clients.items():
                    samples[name] += await _sequential(client, count // ROUNDS)
        rates: dict[str, list[float]] = {name: [] for name in paths}
        meters = _meters(stack)
        for number in range(1, ROUNDS + 1):  # interleaved too: the machine's other load falls on each alike
            progress.update(f"burst {number}/{ROUNDS}: {SESSIONS} sessions x {IN_FLIGHT} in flight, each", force=True)
            for name, connect in paths.items():
                with meters[name].over(burst // ROUNDS):
                    rates[name].append(await _rate(connect, burst // ROUNDS))
        cpu = {name: meter.figures() for name, meter in meters.items()}
        main_cpu = {name: meter.main_thread_figures() for name, meter in meters.items()}
        if profiling():  # an extra, untimed burst each, py-spy on the front, the OAuth front and the bare server
            for name, process in (("front", "front"), ("oauth", "oauth-front"), ("reference", "reference")):
                progress.update(f"profiled: {burst} calls, {SESSIONS} sessions x {IN_FLIGHT} in flight", force=True)
                with sampled(stack.processes[process].pid, f"front-{name}"):
                    await _rate(paths[name], burst)
    finally:
        stack.stop()
        issuer.stop()
    rate = {name: statistics.median(each) for name, each in rates.items()}
    o, a, r = summary_ms(samples["front"]), summary_ms(samples["oauth"]), summary_ms(samples["reference"])
    progress.done(
        f"front p50 {o['p50_ms']:.2f} ms, {rate['front']:.0f} calls/s ({rate['front'] / rate['reference']:.2f}x); "
        f"with OAuth p50 {a['p50_ms']:.2f} ms, {rate['oauth']:.0f} calls/s ({rate['oauth'] / rate['reference']:.2f}x); "
        f"bare SDK server p50 {r['p50_ms']:.2f} ms, {rate['reference']:.0f} calls/s"
    )
    progress.done(f"CPU per call, us: {cpu}")
    progress.done(f"of it, each main thread's: {main_cpu}")
    result = _result(o, a, r, len(samples["front"]), rate, rates)
    result["data"]["cpu_us_per_call"] = cpu
    result["data"]["main_thread_cpu_us_per_call"] = main_cpu
    return result


def _meters(stack: Stack) -> dict[str, CpuPerCall]:
    """CPU per call of each process on each path: the client (this process), the server, and for the fronts the echo
    service and the broker behind them."""
    me = os.getpid()
    behind = {"echo service": stack.processes["echo"].pid}
    if stack.broker is not None and stack.broker.pid is not None:
        behind["broker"] = stack.broker.pid
    return {
        "front": CpuPerCall({"client": me, "front": stack.processes["front"].pid, **behind}),
        "oauth": CpuPerCall({"client": me, "front": stack.processes["oauth-front"].pid, **behind}),
        "reference": CpuPerCall({"client": me, "server": stack.processes["reference"].pid}),
    }


def _connect(url: str, token: str | None = None) -> Connect:
    """A new SDK `Client` on `url` each call (streamable HTTP), sending `token` as its bearer token when given."""

    def connect() -> Client:
        if token is None:
            return Client(url)
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        return Client(streamable_http_client(url, http_client=http))

    return connect


async def _token(issuer: str, resource: str) -> str:
    """An access token for `resource` (its audience, RFC 8707) by client credentials, as an agent would get one."""
    async with httpx2.AsyncClient(timeout=10) as http:
        data = {"grant_type": "client_credentials", "resource": resource, "scope": "mcp"}
        answer = await http.post(f"{issuer}/token", data=data, auth=(CLIENT_ID, SECRET))
    answer.raise_for_status()
    return str(answer.json()["access_token"])


async def _until_listed(connect: Connect, timeout: float = 60.0) -> None:
    """Once the server answers and lists `echo` (a front: once the service's announcement reached it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with connect() as client:
                if any(tool.name == "echo" for tool in (await client.list_tools()).tools):
                    return
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not list echo within {timeout:g} s")
        await asyncio.sleep(0.2)


async def _sequential(client: Client, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        result = await client.call_tool("echo", {"text": TEXT})
        samples.append(time.perf_counter() - t0)
        assert not result.is_error and result.content[0].text == TEXT, result  # type: ignore[union-attr]
    return samples


async def _rate(connect: Connect, total: int) -> float:
    """Calls per second: `SESSIONS` clients, each with `IN_FLIGHT` calls at a time, `total` calls in all."""
    async with connect() as a, connect() as b, connect() as c, connect() as d:
        clients = [a, b, c, d][:SESSIONS]
        per_session = total // len(clients)

        async def session(client: Client) -> None:
            gate = asyncio.Semaphore(IN_FLIGHT)

            async def one() -> None:
                async with gate:
                    result = await client.call_tool("echo", {"text": TEXT})
                    assert not result.is_error, result

            await asyncio.gather(*(one() for _ in range(per_session)))

        await asyncio.gather(*(client.call_tool("echo", {"text": TEXT}) for client in clients))  # each session up
        t0 = time.perf_counter()
        await asyncio.gather(*(session(client) for client in clients))
        return per_session * len(clients) / (time.perf_counter() - t0)


def _result(
    ours: dict[str, float],
    oauth: dict[str, float],
    reference: dict[str, float],
    count: int,
    rate: dict[str, float],
    rates: dict[str, list[float]],
) -> dict[str, Any]:
    return {
        "name": NAME,
        "title": "The MCP front over streamable HTTP (echo through the bus)",
        "rows": [
            {
                "figure": f"{count} sequential calls, p50",
                "ours": ours["p50_ms"],
                "reference": reference["p50_ms"],
                "unit": "ms",
            },
            {
                "figure": f"{count} sequential calls, p99",
                "ours": ours["p99_ms"],
                "reference": reference["p99_ms"],
                "unit": "ms",
            },
            {
                "figure": f"calls/s, {SESSIONS} sessions x {IN_FLIGHT} in flight",
                "ours": round(rate["front"], 1),
                "reference": round(rate["reference"], 1),
                "unit": "calls/s",
                "target": f">= {RATE_TARGET}x",
                "met": rate["front"] >= RATE_TARGET * rate["reference"],
            },
            {
                "figure": f"{count} sequential calls, p50, OAuth on (a JWT checked per request)",
                "ours": oauth["p50_ms"],
                "reference": reference["p50_ms"],
                "unit": "ms",
            },
            {
                "figure": f"calls/s, {SESSIONS} sessions x {IN_FLIGHT} in flight, OAuth on",
                "ours": round(rate["oauth"], 1),
                "reference": round(rate["reference"], 1),
                "unit": "calls/s",
                "target": f">= {OAUTH_RATE_TARGET}x",
                "met": rate["oauth"] >= OAUTH_RATE_TARGET * rate["reference"],
            },
        ],
        "reference_is": "a bare streamable-HTTP server of the official MCP SDK (low-level Server, echo from memory, no "
        "authentication), same client, same run",
        "data": {
            "front_calls_per_s": rate["front"],
            "oauth_front_calls_per_s": rate["oauth"],
            "reference_calls_per_s": rate["reference"],
            "bursts_calls_per_s": rates,
            "oauth_sequential": oauth,
        },
    }

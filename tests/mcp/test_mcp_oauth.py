"""`toolreg mcp --http` as an OAuth 2.1 resource server, against a real authorization server (panva's oidc-provider,
`scripts/oauth_server.py`) and the official SDK client's OAuth flow.

A valid token lists and calls only its tools; every kind of bad token is refused with 401 before MCP sees it, and
no tool runs; the issuer's key rotation is followed; made-up key ids cost the issuer at most one request per
interval; one caller's flood is rate-limited while another's calls go through.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx2
import jwt
import mcp_types as types
import pytest
from mcp.server.auth.provider import AccessToken
from oauth_server import AuthorizationServer
from support import log_events, static_items, toolreg_env
from support.mcp import ERAS, Era, http_session, list_all, text_of
from support.oauth import client, sdk_oauth, signing_key, token

from agent_bridge import ToolSet
from discovery.audit_chain import record_hash
from discovery.broker import EmbeddedBroker
from discovery.mcp.auth import AccessPolicy, AuditTrail, Gate, OAuthSettings, RateLimiter, resource_server
from discovery.mcp.auth.gate import INSUFFICIENT_SCOPE_META, RETRY_AFTER_META
from discovery.mcp.auth.tokens import Refusal
from discovery.mcp.server import DIGEST_META, McpFront
from discovery.mcp.settings import TOKEN_ALGORITHMS
from discovery.mcp.transports import http_server
from toolservice_base import ConfigClient, DynamicToolService, Settings, Transport
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.echo import EchoService
from toolservice_base.schemas import AuditRecord

POLICY = {
    "required-scopes": ["mcp"],
    "rules": [
        {"name": "calculator users", "scopes": ["tools:calc"], "tools": ["calculate"]},
        {"name": "echo users", "scopes": ["tools:echo"], "tools": ["echo"], "workspaces": ["default"]},
        {"name": "operators", "claims": {"groups": "tool-admins"}, "tools": ["*"]},
    ],
}
CLIENTS = ["calc-agent", "echo-agent", "admin-agent", "short-agent", "opaque-agent", "front"]
GRANTS = {
    "calc-agent": "mcp tools:calc",
    "echo-agent": "mcp tools:echo",
    "admin-agent": "mcp",
    "short-agent": "mcp tools:calc",
    "opaque-agent": "mcp tools:calc",
}


def as_config(kid: str = "key-1") -> dict[str, Any]:
    jwk, _ = signing_key(kid)
    return {
        "jwks": {"keys": [jwk]},
        "clients": [client(c) for c in CLIENTS],
        "grants": GRANTS,
        "claims": {"admin-agent": {"groups": ["tool-admins"]}},
        "ttl": {"short-agent": 1},
        "opaque": ["opaque-agent"],
    }


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthorizationServer]:
    """One authorization server for the module: ready in about 0.3 s (its first install is in the first test's
    time)."""
    with AuthorizationServer(as_config(), log=tmp_path_factory.mktemp("oauth") / "as.log") as server:
        yield server


class Counted:
    """Every call the services behind the front received: (tool, user)."""

    calls: list[tuple[str, str]] = []


class CountedCalculator(CalculatorService):
    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        Counted.calls.append(("calculate", user))
        return await super().invoke(user, config, arguments)


class CountedEcho(EchoService):
    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        Counted.calls.append(("echo", user))
        return await super().invoke(user, config, arguments)


@pytest.fixture
async def services(settings: Settings, config_client: ConfigClient) -> AsyncIterator[list[DynamicToolService]]:
    """Calculator and echo, wired by hand (static items), each counting its calls."""
    Counted.calls = []
    started = [cls(settings=settings, announce=False) for cls in (CountedCalculator, CountedEcho)]
    for service in started:
        await service.start()
    await config_client.put(static_items(*started))
    yield started
    for service in started:
        await service.stop()


Serve = Callable[..., AbstractAsyncContextManager[str]]


@pytest.fixture
async def serve(
    settings: Settings, services: list[DynamicToolService], issuer: AuthorizationServer
) -> AsyncIterator[Serve]:
    """`serve(**oauth_changes, rate=None)`: the front on a ToolSet of this test's store, as an OAuth resource server of
    `issuer` with `POLICY`; yields its URL."""
    async with ToolSet(settings=settings) as tools:

        def opened(rate: float | None = None, **changes: Any) -> AbstractAsyncContextManager[str]:
            policy = AccessPolicy.of(POLICY)
            oauth = OAuthSettings(
                issuer=issuer.issuer,
                algorithms=TOKEN_ALGORITHMS,
                skew=0.0,
                required_scopes=policy.required_scopes,
                scopes=tuple(policy.scopes()),
            )
            oauth = OAuthSettings(**{**oauth.__dict__, **changes})
            gate = Gate("default", policy=policy, limiter=RateLimiter(rate) if rate else None)
            return http_server(McpFront(tools, gate=gate), "127.0.0.1", 0, oauth=oauth)

        yield opened


def call_body(name: str, arguments: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


async def raw_call(http: httpx2.AsyncClient, url: str, bearer: str | None, name: str = "calculate") -> httpx2.Response:
    """One 2026-07-28 tools/call (a self-contained POST: no session), as a client that has a token would send it."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Mcp-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    arguments = {"expression": "6 * 7"} if name == "calculate" else {"text": "hi"}
    body = call_body(name, arguments)
    body["params"]["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    }
    return await http.post(url, headers=headers, json=body)


def challenge(response: httpx2.Response) -> dict[str, str]:
    """The parameters of a `WWW-Authenticate: Bearer k="v", ...` header."""
    scheme, _, rest = response.headers["www-authenticate"].partition(" ")
    assert scheme == "Bearer"
    return {k.strip(): v for k, v in (part.split("=", 1) for part in rest.split('", ')) for v in [v.strip('"')]}


@pytest.mark.parametrize("era", ERAS)
async def test_a_valid_token_lists_and_calls_only_its_tools(
    era: Era, serve: Serve, issuer: AuthorizationServer
) -> None:
    async with serve() as url:
        async with http_session(url, era, auth=sdk_oauth(url, issuer.issuer, "calc-agent")) as (session, _):
            assert [t.name for t in (await list_all(session))[0]] == ["calculate"]
            assert text_of(await session.call_tool("calculate", {"expression": "6 * 7"})) == "42"
            refused = await session.call_tool("echo", {"text": "not yours"})
            assert refused.is_error is True
            assert text_of(refused).startswith("insufficient_scope: tool 'echo' needs scope tools:echo")
            step_up = (refused.meta or {})[INSUFFICIENT_SCOPE_META]
            assert step_up == {"error": "insufficient_scope", "scope": "tools:echo"}
        async with http_session(url, era, auth=sdk_oauth(url, issuer.issuer, "admin-agent")) as (session, _):
            assert [t.name for t in (await list_all(session))[0]] == ["calculate", "echo"]  # by its groups claim
            assert text_of(await session.call_tool("echo", {"text": "yours"})) == "yours"
    # the service saw who called (the token's subject), and never the refused call
    assert Counted.calls == [("calculate", "calc-agent"), ("echo", "admin-agent")]


async def test_the_metadata_names_the_issuer_and_the_scopes_at_both_well_known_urls(
    serve: Serve, issuer: AuthorizationServer
) -> None:
    async with serve() as url, httpx2.AsyncClient(timeout=10) as http:
        base = url.removesuffix("/mcp")
        for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
            document = (await http.get(base + path)).json()
            assert document["resource"] == url and document["authorization_servers"] == [issuer.issuer], path
            assert document["scopes_supported"] == ["mcp", "tools:calc", "tools:echo"]
        bare = await raw_call(http, url, None)
        assert bare.status_code == 401
        asked = challenge(bare)
        assert asked == {
            "resource_metadata": f"{base}/.well-known/oauth-protected-resource/mcp",
            "scope": "mcp tools:calc tools:echo",
        }  # no error code when no token was sent (RFC 6750 section 3.1)
        port = url.rsplit(":", 1)[1].split("/")[0]
        for headers in ({"Host": f"attacker.example:{port}"}, {"Origin": "http://attacker.example"}):
            assert (await http.get(base + "/.well-known/oauth-protected-resource", headers=headers)).status_code == 403


def _forged(claims: dict[str, Any], header: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part(header)}.{part(claims)}."


def _hmac_forged(claims: dict[str, Any], header: dict[str, Any], issuer: AuthorizationServer) -> str:
    """The classic confusion: HS256 keyed with the issuer's public key (anyone has it), hoping it is taken as a
    secret."""
    public = {k: v for k, v in issuer.config["jwks"]["keys"][0].items() if k in ("kty", "n", "e")}
    unsigned = _forged(claims, {**header, "alg": "HS256"}).rstrip(".")
    mac = hmac.new(json.dumps(public).encode(), unsigned.encode(), hashlib.sha256).digest()
    return f"{unsigned}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"


async def _bad_tokens(url: str, issuer: AuthorizationServer, other: AuthorizationServer) -> dict[str, tuple[str, str]]:
    """Each bad token by what is wrong with it, and the reason its 401 must give."""
    good = await token(issuer.issuer, "calc-agent", url, "mcp tools:calc")
    header, claims = jwt.get_unverified_header(good), jwt.decode(good, options={"verify_signature": False})
    head, _, signature = good.rsplit(".", 2)[0], None, good.rsplit(".", 1)[1]
    widened = {**claims, "scope": "mcp tools:calc tools:echo"}
    _, attacker_key = signing_key(header["kid"])
    return {
        "expired": (await token(issuer.issuer, "short-agent", url, "mcp"), "has expired"),
        "wrong audience": (
            await token(issuer.issuer, "calc-agent", url.replace("/mcp", "/other"), "mcp"),
            "not for this server",
        ),
        "another resource": (await token(issuer.issuer, "calc-agent", "https://other.example/mcp", "mcp"), "not for"),
        "wrong issuer": (await token(other.issuer, "calc-agent", url, "mcp tools:calc"), "not signed by a key"),
        "alg none": (_forged(claims, {**header, "alg": "none"}), "'none' are not accepted"),
        "HS256 keyed with the public key": (_hmac_forged(claims, header, issuer), "'HS256' are not accepted"),
        "tampered claims": (f"{head.split('.')[0]}.{_forged(widened, header).split('.')[1]}.{signature}", "signature"),
        "signed by another key with the issuer's kid": (
            jwt.encode(widened, attacker_key, "RS256", headers={"kid": header["kid"], "typ": "at+jwt"}),
            "signature",
        ),
        "garbage": ("not-a-token", "not a JWT"),
    }


async def test_every_bad_token_is_refused_with_401_saying_why_and_no_tool_runs(
    serve: Serve, issuer: AuthorizationServer, tmp_path: Path
) -> None:
    with AuthorizationServer(as_config("other-key"), log=tmp_path / "other-as.log") as other:
        async with serve() as url, httpx2.AsyncClient(timeout=10) as http:
            bad = await _bad_tokens(url, issuer, other)
            await asyncio.sleep(1.2)  # the short-lived token's second is over (no skew in this front)
            for case, (bearer, reason) in bad.items():
                refused = await raw_call(http, url, bearer)
                assert refused.status_code == 401, (case, refused.status_code, refused.text)
                asked = challenge(refused)
                assert asked["error"] == "invalid_token" and "resource_metadata" in asked, case
                assert reason in refused.json()["error_description"], (case, refused.text)
            valid = await raw_call(http, url, await token(issuer.issuer, "calc-agent", url, "mcp tools:calc"))
            assert valid.status_code == 200 and "42" in valid.text, valid.text
            without_mcp = await raw_call(http, url, await token(issuer.issuer, "calc-agent", url, "tools:calc"))
            assert without_mcp.status_code == 403 and challenge(without_mcp)["error"] == "insufficient_scope"
            assert challenge(without_mcp)["scope"] == "mcp"
    assert Counted.calls == [("calculate", "calc-agent")]  # the one valid call, and nothing else


async def test_a_key_rotated_at_the_issuer_is_followed(
    serve: Serve, issuer: AuthorizationServer, tmp_path: Path
) -> None:
    with AuthorizationServer(as_config("old-key"), log=tmp_path / "rotating-as.log") as rotating:
        async with serve(issuer=rotating.issuer, jwks_min_refetch=0.5) as url, httpx2.AsyncClient(timeout=10) as http:
            old = await token(rotating.issuer, "calc-agent", url, "mcp tools:calc")
            assert (await raw_call(http, url, old)).status_code == 200
            rotating.restart(jwks=as_config("new-key")["jwks"])  # the old key is gone from its key set
            new = await token(rotating.issuer, "calc-agent", url, "mcp tools:calc")
            await asyncio.sleep(0.6)
            assert (await raw_call(http, url, new)).status_code == 200  # an unknown kid: the key set is fetched again
            dropped = await raw_call(http, url, old)
            assert dropped.status_code == 401 and "not signed by a key" in dropped.json()["error_description"]


async def test_a_token_accepted_before_is_refused_once_it_has_expired(
    serve: Serve, issuer: AuthorizationServer
) -> None:
    async with serve() as url, httpx2.AsyncClient(timeout=10) as http:
        short = await token(issuer.issuer, "short-agent", url, "mcp tools:calc")  # valid for 1 s
        assert (await raw_call(http, url, short)).status_code == 200
        assert (await raw_call(http, url, short)).status_code == 200  # the same bytes again, still valid
        expires = jwt.decode(short, options={"verify_signature": False})["exp"]
        await asyncio.sleep(max(0.0, expires - time.time()) + 1.1)
        late = await raw_call(http, url, short)
        assert late.status_code == 401 and "has expired" in late.json()["error_description"]
    assert Counted.calls == [("calculate", "short-agent")] * 2


async def test_made_up_key_ids_cost_the_issuer_one_request_per_interval_and_no_memory(
    issuer: AuthorizationServer,
) -> None:
    settings = OAuthSettings(issuer=issuer.issuer, algorithms=TOKEN_ALGORITHMS, jwks_min_refetch=60)
    async with resource_server(settings, "http://127.0.0.1:9/mcp") as server:
        checker = server.checker
        assert checker.jwks is not None
        before, keys = checker.jwks.fetches, dict(checker.jwks.keys)
        _, key = signing_key("x")
        forged = [
            jwt.encode({"iss": issuer.issuer}, key, "RS256", headers={"kid": uuid.uuid4().hex, "typ": "at+jwt"})
            for _ in range(300)
        ]
        started = time.monotonic()
        refusals = await asyncio.gather(*(checker.check(t) for t in forged))
        assert {r.reason for r in refusals} == {"unknown_key"}  # type: ignore[union-attr]
        assert checker.jwks.fetches - before <= 1 and checker.jwks.keys == keys
        assert time.monotonic() - started < 2.0


async def test_an_id_token_is_refused_by_its_typ_and_every_access_token_typ_is_accepted(
    issuer: AuthorizationServer,
) -> None:
    """RFC 9068: a JWT access token says `typ: at+jwt`; an ID token of the same issuer (`typ: JWT`), for the same
    audience and validly signed, is not one."""
    resource = "http://127.0.0.1:9/mcp"
    settings = OAuthSettings(issuer=issuer.issuer, algorithms=TOKEN_ALGORITHMS)
    async with resource_server(settings, resource) as server:
        real = await token(issuer.issuer, "calc-agent", resource, "mcp tools:calc")
        header, claims = jwt.get_unverified_header(real), jwt.decode(real, options={"verify_signature": False})
        assert header["typ"] == "at+jwt"
        key = jwt.PyJWK(issuer.config["jwks"]["keys"][0]).key

        def typed(typ: str | None) -> str:
            return jwt.encode(claims, key, "RS256", headers={"kid": header["kid"], "typ": typ})

        refused = await server.checker.check(typed("JWT"))
        assert isinstance(refused, Refusal) and refused.reason == "not_access_token"
        assert "typ is 'JWT', not at+jwt: it is not an access token (an ID token?)" in refused.description
        for accepted in (real, typed("AT+JWT"), typed("application/at+jwt"), typed(None)):
            assert isinstance(await server.checker.check(accepted), AccessToken), jwt.get_unverified_header(accepted)


async def test_opaque_tokens_are_introspected_with_the_fronts_own_credentials(
    serve: Serve, issuer: AuthorizationServer
) -> None:
    from support.oauth import SECRET

    async with serve(introspection_client="front", introspection_secret=SECRET) as url:
        async with httpx2.AsyncClient(timeout=10) as http:
            opaque = await token(issuer.issuer, "opaque-agent", url, "mcp tools:calc")
            assert opaque.count(".") != 2
            called = await raw_call(http, url, opaque)
            assert called.status_code == 200 and "42" in called.text, called.text
            elsewhere = await token(issuer.issuer, "opaque-agent", "https://other.example/mcp", "mcp tools:calc")
            refused = await raw_call(http, url, elsewhere)
            assert refused.status_code == 401 and "not for this server" in refused.json()["error_description"]
    assert Counted.calls == [("calculate", "opaque-agent")]


@pytest.fixture
async def command(
    broker: EmbeddedBroker, services: list[DynamicToolService], issuer: AuthorizationServer, tmp_path: Path
) -> AsyncIterator[tuple[str, Path]]:
    """`toolreg mcp --http 127.0.0.1:0 --oauth-issuer ... --policy ... --rate-limit 20` as an operator starts it: its
    URL and its log."""
    policy = tmp_path / "access.json"
    policy.write_text(json.dumps(POLICY))
    log = tmp_path / "mcp.log"
    with open(log, "ab") as errors:
        process = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "discovery.cli", "mcp", "--http", "127.0.0.1:0", "--rate-limit", "20"],
            *["--oauth-issuer", issuer.issuer, "--policy", str(policy)],
            env=toolreg_env(broker.url, tmp_path / "mcp"),
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
        )
    assert process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert line.startswith("mcp ") and f"(OAuth 2.1: tokens of {issuer.issuer})" in line, (line, log.read_text())
        yield line.split()[1], log
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0


async def test_one_callers_flood_is_rate_limited_while_another_caller_is_unaffected(
    command: tuple[str, Path], issuer: AuthorizationServer
) -> None:
    """500 calls offered at 500 a second by one subject against `--rate-limit 20`: the burst and 20 a second go
    through, the rest are told when to retry, and another subject calling meanwhile is never limited. Every call is in
    the audit log."""
    url, log = command
    rate = 20.0
    limits = httpx2.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx2.AsyncClient(timeout=30, limits=limits) as http:
        flooder = await token(issuer.issuer, "calc-agent", url, "mcp tools:calc")
        bystander = await token(issuer.issuer, "admin-agent", url, "mcp")
        await raw_call(http, url, bystander, "echo")  # connections warm
        answers: list[httpx2.Response] = []

        async def flood() -> float:
            began = time.monotonic()

            async def one(n: int) -> None:
                await asyncio.sleep(n / 500)  # offered at 500 calls/s
                answers.append(await raw_call(http, url, flooder))

            await asyncio.gather(*(one(n) for n in range(500)))
            return time.monotonic() - began

        async def steady() -> list[httpx2.Response]:
            got = []
            for _ in range(10):
                got.append(await raw_call(http, url, bystander, "echo"))
                await asyncio.sleep(0.05)
            return got

        elapsed, calm = await asyncio.gather(flood(), steady())
    results = [types.CallToolResult.model_validate(_result(a)) for a in answers]
    allowed = [r for r in results if not r.is_error]
    limited = [r for r in results if r.is_error]
    print(f"500 calls from one caller in {elapsed:.2f} s ({500 / elapsed:.0f}/s answered): {len(allowed)} allowed")
    # The flood outran the limit (whatever the machine's load made of its pace), and the limit held.
    assert len(limited) >= 500 - (rate + rate * elapsed + 1) > 0, f"the front answered only {500 / elapsed:.0f} calls/s"
    assert len(allowed) <= rate + rate * elapsed + 1  # the burst, and the rate over the time it took
    assert all(text_of(r).startswith("rate_limited: at most 20 calls per second") for r in limited)
    assert all(0 < (r.meta or {})[RETRY_AFTER_META] <= 1 / rate + 0.001 for r in limited)
    assert [text_of(types.CallToolResult.model_validate(_result(a))) for a in calm] == ["hi"] * 10
    await asyncio.sleep(0.2)
    calls = log_events(log.read_text(), "mcp.call")
    outcomes = Counter((c["subject"], c["tool"], c["outcome"]) for c in calls)
    assert outcomes == {
        ("calc-agent", "calculate", "ok"): len(allowed),
        ("calc-agent", "calculate", "rate_limited"): len(limited),
        ("admin-agent", "echo", "ok"): 11,
    }
    assert all(c["digest"] and c["duration_ms"] >= 0 and "arguments" not in c for c in calls)


def _result(response: httpx2.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    if response.headers["content-type"].startswith("application/json"):
        return dict(response.json()["result"])
    data = [line[5:] for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()]
    return dict(json.loads(data[-1])["result"])


async def test_calls_are_published_on_the_persistent_audit_topic_with_arguments_when_asked(
    settings: Settings, services: list[DynamicToolService], issuer: AuthorizationServer, connection: Transport
) -> None:
    policy = AccessPolicy.of(POLICY)
    oauth = OAuthSettings(issuer=issuer.issuer, algorithms=TOKEN_ALGORITHMS, scopes=tuple(policy.scopes()))
    gate = Gate("default", policy=policy, audit=AuditTrail("default", arguments=True))
    async with ToolSet(settings=settings) as tools, gate.trail.publishing(connection):
        async with http_server(McpFront(tools, gate=gate), "127.0.0.1", 0, oauth=oauth) as url:
            async with http_session(url, "legacy", auth=sdk_oauth(url, issuer.issuer, "calc-agent")) as (session, _):
                await session.call_tool("calculate", {"expression": "1 + 1"})
                await session.call_tool("echo", {"text": "not yours"})
                digest = (await session.list_tools()).tools[0].meta[DIGEST_META]  # type: ignore[index]
    assert gate.trail.published == 2
    reader = await connection.reader(connection.topics.mcp_audit, "earliest")
    try:
        records = [AuditRecord.model_validate_json((await reader.read_next(5)).data) for _ in range(2)]  # type: ignore[union-attr]
    finally:
        await connection.close_reader(reader)
    assert [(r.subject, r.tool, r.outcome, r.arguments) for r in records] == [
        ("calc-agent", "calculate", "ok", {"expression": "1 + 1"}),
        ("calc-agent", "echo", "denied", {"text": "not yours"}),
    ]
    assert records[0].digest == digest and records[1].detail.startswith("insufficient_scope: tool 'echo' needs")
    assert records[0].front == records[1].front and records[0].workspace == "default"
    # a front without an audit key chains its records but cannot sign them: verifiers take them as unsigned
    assert [(r.sequence, r.signature) for r in records] == [(1, None), (2, None)]
    assert records[1].previous == record_hash(records[0].to_wire())

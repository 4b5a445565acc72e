"""The MCP front never waits on its OAuth issuer past a bound, whatever the issuer does.

An issuer whose key set trickles one byte at a time (each read gets its byte in time, so no timeout per read ever
fires) is cut at the deadline of the whole fetch; the scheduled refresh of the key set runs in the background, so a
request with a known key never waits on it; a token with an unknown key id starts one refetch and waits for it only
briefly, then is refused saying why. The issuer is a tiny local HTTP server (`support.oauth.SlowIssuer`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import jwt
import pytest
from support import eventually
from support.oauth import SlowIssuer, signing_key

from discovery.mcp.auth.issuer import IssuerError, JwksCache
from discovery.mcp.auth.tokens import Refusal, TokenChecker
from discovery.mcp.settings import TOKEN_ALGORITHMS

ISSUER = "http://127.0.0.1:9"
RESOURCE = "http://127.0.0.1:9/mcp"
BOUND = 20.0
"""Seconds a test waits before calling a check hung: ten times any bound the front keeps, far below the 120 s a
trickling key set took."""

HELD = 3 * BOUND
"""The deadline of a trickled fetch where a test needs it still under way while it checks (the test ends it)."""

PRIVATE_PARTS = ("d", "p", "q", "dp", "dq", "qi")
JWK, KEY = signing_key("key-1")


def access_token(kid: str = "key-1") -> str:
    claims = {"iss": ISSUER, "aud": RESOURCE, "sub": "agent", "exp": int(time.time()) + 300}
    return jwt.encode(claims, KEY, "RS256", headers={"kid": kid, "typ": "at+jwt"})


@pytest.fixture
async def slow() -> AsyncIterator[SlowIssuer]:
    public = {k: v for k, v in JWK.items() if k not in PRIVATE_PARTS}
    async with SlowIssuer([public]) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(timeout=5.0, follow_redirects=False) as client:
        yield client


def checker(cache: JwksCache) -> TokenChecker:
    return TokenChecker(issuer=ISSUER, resource=RESOURCE, algorithms=TOKEN_ALGORITHMS, skew=0.0, jwks=cache)


async def test_a_trickling_key_set_is_cut_at_the_deadline_of_the_whole_fetch(
    slow: SlowIssuer, http: httpx2.AsyncClient
) -> None:
    slow.trickle = True
    cache = JwksCache(http, slow.url)
    with pytest.raises(IssuerError, match=r"the issuer's key set at .* was not read within 5 s"):
        await asyncio.wait_for(cache.start(), BOUND)


async def test_a_scheduled_refresh_is_never_on_a_requests_path(slow: SlowIssuer, http: httpx2.AsyncClient) -> None:
    cache = JwksCache(http, slow.url, ttl=0.1, deadline=HELD)
    await cache.start()
    try:
        slow.trickle = True
        await eventually(lambda: slow.served >= 2, timeout=BOUND)  # the refresh is under way, and trickling
        accepted = await asyncio.wait_for(checker(cache).check(access_token()), BOUND)
        assert not isinstance(accepted, Refusal), accepted
        assert cache.refetching, "answered while the refresh was still waiting on the issuer"
    finally:
        await cache.close()


async def test_an_unknown_key_id_waits_briefly_for_one_refetch_then_is_refused_saying_why(
    slow: SlowIssuer, http: httpx2.AsyncClient
) -> None:
    cache = JwksCache(http, slow.url, min_refetch=0.0, deadline=HELD)
    await cache.start()
    try:
        slow.trickle = True
        tokens = [access_token(kid=uuid.uuid4().hex) for _ in range(20)]
        refused = await asyncio.wait_for(asyncio.gather(*(checker(cache).check(t) for t in tokens)), BOUND)
        reasons: set[Any] = {(r.reason, r.description) for r in refused if isinstance(r, Refusal)}
        assert len(reasons) == 1 and len(refused) == 20, refused
        reason, description = reasons.pop()
        assert reason == "unknown_key" and "the issuer's key set did not come within 2 s; retry" in description
        assert slow.served == 2, "twenty unknown key ids cost the issuer one request"
        assert cache.keys.keys() == {"key-1"}
    finally:
        await cache.close()

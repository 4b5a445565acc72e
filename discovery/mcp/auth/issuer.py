"""What the front learns from its authorization server: its metadata, and its signing keys kept fresh.

`IssuerMetadata.discover` reads RFC 8414 metadata (then OpenID Connect
Discovery) and insists it names the configured issuer exactly, so a
misconfigured or hijacked metadata document cannot point the front at other
keys. `JwksCache` holds the issuer's JSON Web Key Set:

- fetched at start and again every `JWKS_TTL` seconds (keys rotate: the
  issuer publishes a new key beside the old one, then drops the old one);
- a token signed with a key id the cache does not know triggers one refetch,
  at most every `MIN_REFETCH` seconds, whoever asks: tokens with made-up key
  ids cannot make the front hammer its issuer, and nothing is cached per
  key id asked for (the cache holds only what the issuer published, at most
  `MAX_KEYS` keys of a document of at most `MAX_DOCUMENT` bytes);
- concurrent refetches are one request (single flight);
- a failed refetch keeps the keys it had: an issuer briefly away does not
  lock every caller out.

Every fetch is a plain GET with a timeout and no redirects, over https (http
only to a loopback issuer, for tests and laptops).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx2

from discovery.web.health import is_loopback_host
from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.logs import get_logger

log = get_logger("discovery.mcp")

FETCH_TIMEOUT = 5.0
MAX_DOCUMENT = 256 * 1024
"""Bytes of a metadata document or key set read at most; a larger one is refused."""
MAX_KEYS = 64
JWKS_TTL = 300.0
"""Seconds a key set is used before it is fetched again (the issuer's rotation is followed within this)."""
MIN_REFETCH = 10.0
"""Seconds between two refetches for an unknown key id, at most one per this interval."""


class IssuerError(ToolDiscoveryError):
    """The authorization server could not be read, or said something the front cannot use; the message says which."""


def check_url(url: str, what: str) -> str:
    """`url` if it is https, or http to a loopback host; else `IssuerError`."""
    parts = urlsplit(url)
    if parts.scheme == "https" or (parts.scheme == "http" and parts.hostname and is_loopback_host(parts.hostname)):
        if parts.fragment:
            raise IssuerError(f"{what} {url!r} has a fragment; give the URL without '#...'")
        return url
    raise IssuerError(f"{what} {url!r} must be an https URL (http only on loopback)")


async def fetch_json(client: httpx2.AsyncClient, url: str, what: str) -> dict[str, Any]:
    """GET `url` as a JSON object of at most `MAX_DOCUMENT` bytes; `IssuerError` saying what went wrong."""
    try:
        async with client.stream("GET", url, headers={"Accept": "application/json"}) as response:
            if response.status_code != 200:
                raise IssuerError(f"{what} at {url} answered HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_DOCUMENT:
                    raise IssuerError(f"{what} at {url} is larger than {MAX_DOCUMENT} bytes")
    except httpx2.HTTPError as exc:
        raise IssuerError(f"cannot read {what} at {url}: {exc or type(exc).__name__}") from None
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise IssuerError(f"{what} at {url} is not JSON") from None
    if not isinstance(document, dict):
        raise IssuerError(f"{what} at {url} is not a JSON object")
    return document


def http_client() -> httpx2.AsyncClient:
    return httpx2.AsyncClient(timeout=FETCH_TIMEOUT, follow_redirects=False)


@dataclass(frozen=True)
class IssuerMetadata:
    """The parts of an authorization server's metadata the front uses."""

    issuer: str
    jwks_uri: str | None
    introspection_endpoint: str | None
    scopes_supported: tuple[str, ...] = ()

    @classmethod
    async def discover(cls, client: httpx2.AsyncClient, issuer: str) -> IssuerMetadata:
        """RFC 8414's well-known URL (path inserted after the host), then OpenID Connect's (appended to the issuer)."""
        check_url(issuer, "the OAuth issuer")
        parts = urlsplit(issuer)
        path = parts.path.rstrip("/")
        base = f"{parts.scheme}://{parts.netloc}"
        candidates = [
            f"{base}/.well-known/oauth-authorization-server{path}",
            f"{base}{path}/.well-known/openid-configuration",
        ]
        problems = []
        for url in candidates:
            try:
                document = await fetch_json(client, url, "the issuer's metadata")
            except IssuerError as exc:
                problems.append(str(exc))
                continue
            return cls.of(document, issuer)
        raise IssuerError(f"no metadata for OAuth issuer {issuer}: {'; '.join(problems)}")

    @classmethod
    def of(cls, document: Mapping[str, Any], issuer: str) -> IssuerMetadata:
        named = document.get("issuer")
        if named != issuer:  # RFC 8414 section 3.3: identical, character for character
            raise IssuerError(f"the metadata found for OAuth issuer {issuer} names issuer {named!r}; they must match")
        jwks = document.get("jwks_uri")
        introspection = document.get("introspection_endpoint")
        scopes = document.get("scopes_supported")
        return cls(
            issuer=issuer,
            jwks_uri=check_url(jwks, "the issuer's jwks_uri") if isinstance(jwks, str) else None,
            introspection_endpoint=(
                check_url(introspection, "the issuer's introspection_endpoint")
                if isinstance(introspection, str)
                else None
            ),
            scopes_supported=tuple(s for s in scopes if isinstance(s, str)) if isinstance(scopes, list) else (),
        )


class JwksCache:
    """The issuer's public keys by key id, refreshed on a schedule and, boundedly, on an unknown key id."""

    def __init__(
        self,
        client: httpx2.AsyncClient,
        url: str,
        *,
        ttl: float = JWKS_TTL,
        min_refetch: float = MIN_REFETCH,
    ) -> None:
        self.client = client
        self.url = check_url(url, "the JWKS URI")
        self.ttl = ttl
        self.min_refetch = min_refetch
        self.keys: dict[str, dict[str, Any]] = {}
        self.fetched_at = -float("inf")
        self.fetches = 0
        """Key-set requests made: what a test reads to see unknown key ids do not each cost one."""
        self._attempted_at = -float("inf")
        self._inflight: asyncio.Future[None] | None = None

    async def start(self) -> None:
        """The first fetch; an issuer unreachable at start is one line (`IssuerError`)."""
        await self._fetch()

    async def key(self, kid: str | None) -> dict[str, Any] | None:
        """The JWK for `kid` (None: the only key, if there is one), refetching as the module says; None if unknown."""
        now = time.monotonic()
        if now - self.fetched_at >= self.ttl and now - self._attempted_at >= self.min_refetch:
            await self._refresh()
        found = self._lookup(kid)
        if found is None and time.monotonic() - self._attempted_at >= self.min_refetch:
            await self._refresh()
            found = self._lookup(kid)
        return found

    def _lookup(self, kid: str | None) -> dict[str, Any] | None:
        if kid is None:
            return next(iter(self.keys.values())) if len(self.keys) == 1 else None
        return self.keys.get(kid)

    async def _refresh(self) -> None:
        """One fetch for everyone who asks meanwhile; a failure keeps the keys held and is logged."""
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._fetch())
            self._inflight.add_done_callback(self._fetched)
        try:
            await asyncio.shield(self._inflight)
        except IssuerError as exc:
            log.warning("mcp.jwks_refresh_failed", error=str(exc), keys_kept=len(self.keys))

    def _fetched(self, done: asyncio.Future[None]) -> None:
        self._inflight = None
        if not done.cancelled():
            done.exception()  # retrieved here too: every waiter may have been cancelled meanwhile

    async def _fetch(self) -> None:
        self._attempted_at = time.monotonic()
        self.fetches += 1
        document = await fetch_json(self.client, self.url, "the issuer's key set")
        listed = document.get("keys")
        if not isinstance(listed, list):
            raise IssuerError(f"the key set at {self.url} has no 'keys' list")
        keys: dict[str, dict[str, Any]] = {}
        for jwk in listed[: MAX_KEYS * 4]:
            if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig" or not isinstance(jwk.get("kty"), str):
                continue  # encryption keys and garbage are not signing keys
            kid = jwk.get("kid")
            keys[kid if isinstance(kid, str) else f"#{len(keys)}"] = jwk
            if len(keys) >= MAX_KEYS:
                break
        if not keys:
            raise IssuerError(f"the key set at {self.url} holds no signing key")
        changed = keys.keys() != self.keys.keys()
        self.keys, self.fetched_at = keys, time.monotonic()
        if changed:
            log.info("mcp.jwks_loaded", url=self.url, keys=sorted(keys))

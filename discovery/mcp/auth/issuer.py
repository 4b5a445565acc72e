"""What the front learns from its authorization server: its metadata, and its signing keys kept fresh.

`IssuerMetadata.discover` reads RFC 8414 metadata (then OpenID Connect
Discovery) and insists it names the configured issuer exactly, so a
misconfigured or hijacked metadata document cannot point the front at other
keys. `JwksCache` holds the issuer's JSON Web Key Set:

- fetched at start and again every `JWKS_TTL` seconds by a task of its own
  (keys rotate: the issuer publishes a new key beside the old one, then
  drops the old one): a request never waits on a scheduled refresh, it is
  checked against the keys held meanwhile;
- a token signed with a key id the cache does not know starts one refetch,
  at most every `MIN_REFETCH` seconds, whoever asks, and waits for it at
  most `KEY_WAIT` seconds (then it is refused, and the refetch goes on in
  the background): tokens with made-up key ids cannot make the front hammer
  its issuer, nor hold requests for long, and nothing is cached per key id
  asked for (the cache holds only what the issuer published, at most
  `MAX_KEYS` keys of a document of at most `MAX_DOCUMENT` bytes);
- concurrent refetches are one request (single flight);
- a failed refetch keeps the keys it had: an issuer briefly away does not
  lock every caller out.

Every fetch is a plain request with no redirects, over https (http only to a
loopback issuer, for tests and laptops), bounded by `FETCH_TIMEOUT` as a
whole (connecting, the headers and the body together: an issuer that
trickles its answer a byte at a time is cut at that deadline, not allowed
a timeout per read) and by `MAX_DOCUMENT` bytes.
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
from toolservice_base.tasks import cancel_and_wait

log = get_logger("discovery.mcp")

FETCH_TIMEOUT = 5.0
"""Seconds one fetch from the issuer may take in all (connect, headers, body); past it the fetch fails."""
MAX_DOCUMENT = 256 * 1024
"""Bytes of a metadata document or key set read at most; a larger one is refused."""
MAX_KEYS = 64
JWKS_TTL = 300.0
"""Seconds a key set is used before it is fetched again (the issuer's rotation is followed within this)."""
MIN_REFETCH = 10.0
"""Seconds between two refetches for an unknown key id, at most one per this interval."""
KEY_WAIT = 2.0
"""Seconds a request with an unknown key id waits for the key set being fetched again before it is refused."""


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


async def fetch_json(
    client: httpx2.AsyncClient,
    url: str,
    what: str,
    *,
    method: str = "GET",
    data: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    deadline: float = FETCH_TIMEOUT,
) -> dict[str, Any]:
    """`method` `url` answered with a JSON object of at most `MAX_DOCUMENT` bytes within `deadline` seconds in all;
    `IssuerError` saying what went wrong."""
    body = bytearray()
    try:
        async with asyncio.timeout(deadline):
            async with client.stream(
                method, url, data=data, headers={"Accept": "application/json", **(headers or {})}
            ) as response:
                if response.status_code != 200:
                    raise IssuerError(f"{what} at {url} answered HTTP {response.status_code}")
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_DOCUMENT:
                        raise IssuerError(f"{what} at {url} is larger than {MAX_DOCUMENT} bytes")
    except TimeoutError:
        raise IssuerError(
            f"{what} at {url} was not read within {deadline:g} s (connecting, headers and body); the issuer is too "
            f"slow ({len(body)} bytes came)"
        ) from None
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
    """The issuer's public keys by key id, refreshed on a schedule in the background and, boundedly, on an unknown
    key id."""

    def __init__(
        self,
        client: httpx2.AsyncClient,
        url: str,
        *,
        ttl: float = JWKS_TTL,
        min_refetch: float = MIN_REFETCH,
        deadline: float = FETCH_TIMEOUT,
        key_wait: float = KEY_WAIT,
    ) -> None:
        self.client = client
        self.url = check_url(url, "the JWKS URI")
        self.ttl = ttl
        self.min_refetch = min_refetch
        self.deadline = deadline
        self.key_wait = key_wait
        self.keys: dict[str, dict[str, Any]] = {}
        self.fetched_at = -float("inf")
        self.fetches = 0
        """Key-set requests made: what a test reads to see unknown key ids do not each cost one."""
        self._attempted_at = -float("inf")
        self._inflight: asyncio.Task[None] | None = None
        self._schedule: asyncio.Task[None] | None = None

    @property
    def refetching(self) -> bool:
        """Whether a fetch of the key set is under way now (a request refused meanwhile is told so)."""
        return self._inflight is not None

    async def start(self) -> None:
        """The first fetch, then the scheduled refreshes in the background; an issuer unreachable at start is one
        line (`IssuerError`)."""
        await self._fetch()
        self._schedule = asyncio.create_task(self._refresh_every(), name="mcp-jwks-refresh")

    async def close(self) -> None:
        """Stop refreshing (the scheduled task and any fetch under way)."""
        for task in (self._schedule, self._inflight):
            if task is not None:
                await cancel_and_wait(task)
        self._schedule = None

    async def _refresh_every(self) -> None:
        """A fetch every `ttl` seconds (every `min_refetch` after a failed one), off every request's path."""
        while True:
            due = self.fetched_at + self.ttl - time.monotonic()
            if due > 0:
                await asyncio.sleep(due)
                continue
            await asyncio.wait({self._refetch()})
            if time.monotonic() - self.fetched_at >= self.ttl:  # it failed: the keys held serve meanwhile
                await asyncio.sleep(self.min_refetch)

    async def key(self, kid: str | None) -> dict[str, Any] | None:
        """The JWK for `kid` (None: the only key, if there is one), refetching as the module says; None if unknown."""
        found = self._lookup(kid)
        if found is not None:
            return found
        if self._inflight is None and time.monotonic() - self._attempted_at < self.min_refetch:
            return None
        await asyncio.wait({self._refetch()}, timeout=self.key_wait)  # never cancels the fetch: others may wait
        return self._lookup(kid)

    def current(self, kid: str | None) -> dict[str, Any] | None:
        """The JWK held now for `kid` (as `key` finds it), without fetching: None if none is held."""
        return self._lookup(kid)

    def _lookup(self, kid: str | None) -> dict[str, Any] | None:
        if kid is None:
            return next(iter(self.keys.values())) if len(self.keys) == 1 else None
        return self.keys.get(kid)

    def _refetch(self) -> asyncio.Task[None]:
        """One fetch for everyone who asks meanwhile (single flight); a failure keeps the keys held and is logged."""
        if self._inflight is None:
            self._inflight = asyncio.create_task(self._fetch(), name="mcp-jwks-fetch")
            self._inflight.add_done_callback(self._fetched)
        return self._inflight

    def _fetched(self, done: asyncio.Task[None]) -> None:
        self._inflight = None
        if done.cancelled():
            return
        error = done.exception()  # retrieved here: nobody may be waiting for it
        if error is not None:
            log.warning("mcp.jwks_refresh_failed", error=str(error), keys_kept=len(self.keys))

    async def _fetch(self) -> None:
        self._attempted_at = time.monotonic()
        self.fetches += 1
        document = await fetch_json(self.client, self.url, "the issuer's key set", deadline=self.deadline)
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

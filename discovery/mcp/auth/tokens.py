"""Access tokens checked as an OAuth 2.1 resource server: JWTs against the issuer's keys, opaque ones by introspection.

`TokenChecker` is the MCP SDK's `TokenVerifier` (`verify_token`), and says
why it refused a token (`check`), so the 401 can tell the client and the
log can tell the operator. A JWT access token is accepted only when all of
this holds, checked by PyJWT (no cryptography here):

- its `typ`, if it has one, is `at+jwt` or `application/at+jwt` (RFC 9068,
  any case): an ID token (`typ: JWT`) of the same issuer and audience is
  not an access token;
- its `alg` is in the allow-list (asymmetric algorithms only, never `none`
  or an HMAC, whose secret a published key would be) and agrees with the
  key's own `alg` when the issuer names one;
- its signature verifies with a key the issuer publishes (`issuer.JwksCache`);
- `iss` is the configured issuer, character for character;
- `exp` is present and not past, `nbf` (if any) not ahead, each within the
  allowed clock skew;
- `aud` names this server's canonical resource URI (RFC 8707): a token the
  issuer minted for another resource is refused, whoever holds it.

A token that is not a JWT goes to the issuer's introspection endpoint
(RFC 7662), when the front has client credentials for it, and must come back
`active`, from the same issuer, for this audience and unexpired. Answers are
cached by the token's SHA-256 for at most `INTROSPECTION_TTL` seconds and
`INTROSPECTION_CACHE` tokens (the oldest go), so a revoked token is refused
within that time and no caller can grow the cache without bound.

A JWT once accepted is not checked again while it is unexpired and the key
that verified it is still the issuer's (`VERDICTS` tokens at most, the
oldest go): the signature and claims of the same bytes cannot change, and
a client sends the same token with each of its requests (a full check is
120-150 us of the front's loop per request, measured on a 2048-bit RSA
token). A key the issuer no longer publishes, or a key set fetched again,
sends the token through the full check; refusals are never kept.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2
import jwt
from mcp.server.auth.provider import AccessToken

from toolservice_base.logs import get_logger

from .issuer import IssuerError, JwksCache, fetch_json

log = get_logger("discovery.mcp")

INTROSPECTION_TTL = 30.0
INTROSPECTION_CACHE = 10_000
VERDICTS = 10_000
"""Accepted JWTs remembered at most (each until it expires or its key goes), so no caller grows the memory."""
INTROSPECTION_CONCURRENCY = 8
"""Introspection requests in flight at once; more callers wait their turn instead of flooding the issuer."""
MAX_TOKEN = 16 * 1024
"""Characters of a token looked at; a longer one is refused unread."""
REFUSALS_LOGGED_EVERY = 10.0
ACCESS_TOKEN_TYPES = frozenset({"at+jwt", "application/at+jwt"})
"""The `typ` header values of a JWT access token (RFC 9068 section 4), compared in lower case."""


@dataclass(frozen=True)
class Refusal:
    """Why a token was refused: a short `reason` for logs and metrics, a one-line `description` for the client."""

    reason: str
    description: str


def canonical(uri: str) -> str:
    """A resource URI compared as RFC 8707 and the MCP spec ask: scheme and host lower-case, default port and trailing
    slash dropped."""
    try:
        parts = urlsplit(uri.strip())
        port = parts.port
    except ValueError:
        return uri
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    scheme = parts.scheme.lower()
    if port is not None and (scheme, port) not in (("http", 80), ("https", 443)):
        host = f"{host}:{port}"
    return urlunsplit((scheme, host, parts.path.rstrip("/"), parts.query, ""))


def scopes_of(claims: Mapping[str, Any]) -> list[str]:
    """`scope` (RFC 9068: space-separated) or `scp` (a list, as some issuers write it)."""
    given = claims.get("scope", claims.get("scp"))
    if isinstance(given, str):
        return [s for s in given.split() if s]
    if isinstance(given, list):
        return [s for s in given if isinstance(s, str) and s]
    return []


def audiences(claims: Mapping[str, Any]) -> list[str]:
    given = claims.get("aud")
    if isinstance(given, str):
        return [given]
    if isinstance(given, list):
        return [a for a in given if isinstance(a, str)]
    return []


def token_key(token: str) -> bytes:
    """What both caches keep a token's verdict by: its SHA-256, 32 bytes where the token may be 16 KiB."""
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True, slots=True)
class _Verdict:
    """An accepted JWT: what it grants, the key that verified it, and until when (its `exp` plus the skew)."""

    access: AccessToken
    kid: str | None
    jwk: dict[str, Any]
    until: float


class Introspection:
    """RFC 7662 introspection with the front's own client credentials (`client_secret_basic`), bounded and cached."""

    def __init__(self, client: httpx2.AsyncClient, endpoint: str, client_id: str, secret: str) -> None:
        self.client = client
        self.endpoint = endpoint
        self._auth = "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()
        self._cache: OrderedDict[bytes, tuple[float, dict[str, Any]]] = OrderedDict()
        self._slots = asyncio.Semaphore(INTROSPECTION_CONCURRENCY)

    async def claims(self, token: str) -> dict[str, Any] | Refusal:
        key = token_key(token)
        cached = self._cache.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        async with self._slots:
            try:
                answer = await self._ask(token)
            except IssuerError as exc:
                log.warning("mcp.introspection_failed", error=str(exc))
                return Refusal("introspection_failed", "the token could not be checked with its issuer; try again")
        if answer.get("active") is not True:
            return Refusal("inactive", "the issuer says the token is not active (expired, revoked or unknown)")
        self._cache[key] = (time.monotonic() + INTROSPECTION_TTL, answer)
        self._cache.move_to_end(key)
        while len(self._cache) > INTROSPECTION_CACHE:
            self._cache.popitem(last=False)
        return answer

    async def _ask(self, token: str) -> dict[str, Any]:
        return await fetch_json(
            self.client,
            self.endpoint,
            "introspection",
            method="POST",
            data={"token": token, "token_type_hint": "access_token"},
            headers={"Authorization": self._auth},
        )


class TokenChecker:
    """The MCP SDK's `TokenVerifier` for one issuer and one resource; `check` says why a token is refused."""

    def __init__(
        self,
        *,
        issuer: str,
        resource: str,
        algorithms: tuple[str, ...],
        skew: float,
        jwks: JwksCache | None,
        introspection: Introspection | None = None,
    ) -> None:
        self.issuer = issuer
        self.resource = resource
        self._resource = canonical(resource)
        self.algorithms = algorithms
        self.skew = skew
        self.jwks = jwks
        self.introspection = introspection
        self.refused: Counter[str] = Counter()
        """Refusals by reason since the process started."""
        self._unlogged: Counter[str] = Counter()
        self._logged_at = -REFUSALS_LOGGED_EVERY
        self._verdicts: OrderedDict[bytes, _Verdict] = OrderedDict()
        """By the token's SHA-256, as the introspection cache: a token may be 16 KiB, its digest is 32 bytes."""

    async def verify_token(self, token: str) -> AccessToken | None:
        checked = await self.check(token)
        return checked if isinstance(checked, AccessToken) else None

    async def check(self, token: str) -> AccessToken | Refusal:
        outcome = await self._check(token)
        if isinstance(outcome, Refusal):
            self._count(outcome)
        return outcome

    async def _check(self, token: str) -> AccessToken | Refusal:
        if not token or len(token) > MAX_TOKEN:
            return Refusal("malformed", "the bearer token is empty or too long")
        if token.count(".") == 2 and self.jwks is not None:
            return self._held(token) or await self._check_jwt(token)
        if self.introspection is not None:
            claims = await self.introspection.claims(token)
            return claims if isinstance(claims, Refusal) else self._accept(token, claims, introspected=True)
        return Refusal("malformed", "the bearer token is not a JWT access token of this server's issuer")

    def _held(self, token: str) -> AccessToken | None:
        """The verdict on a JWT accepted before, if it still stands: unexpired, and its key still the one the issuer
        publishes under its id (the same object: a key set fetched again holds new ones)."""
        assert self.jwks is not None
        key = token_key(token)
        held = self._verdicts.get(key)
        if held is None:
            return None
        if held.until < time.time() or self.jwks.current(held.kid) is not held.jwk:
            del self._verdicts[key]
            return None
        return held.access

    def _hold(self, token: str, access: AccessToken, kid: str | None, jwk: dict[str, Any]) -> None:
        if access.expires_at is None:
            return
        self._verdicts[token_key(token)] = _Verdict(access, kid, jwk, access.expires_at + self.skew)
        while len(self._verdicts) > VERDICTS:
            self._verdicts.popitem(last=False)

    async def _check_jwt(self, token: str) -> AccessToken | Refusal:
        assert self.jwks is not None
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return Refusal("malformed", "the bearer token is not a well-formed JWT")
        typ, alg, kid = header.get("typ"), header.get("alg"), header.get("kid")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in ACCESS_TOKEN_TYPES):
            shown = typ[:40] if isinstance(typ, str) else str(typ)[:40]
            return Refusal(
                "not_access_token",
                f"the token's typ is {shown!r}, not at+jwt: it is not an access token (an ID token?); send an access "
                "token for this server",
            )
        if not isinstance(alg, str) or alg not in self.algorithms:
            shown = alg if isinstance(alg, str) else "no algorithm"
            return Refusal("algorithm", f"tokens signed with {shown[:20]!r} are not accepted here")
        if kid is not None and not isinstance(kid, str):
            return Refusal("malformed", "the token's key id (kid) is not a string")
        jwk = await self.jwks.key(kid)
        if jwk is None and self.jwks.refetching:
            return Refusal(
                "unknown_key",
                f"the token is not signed by a key its issuer publishes, as far as this server knows: the issuer's "
                f"key set did not come within {self.jwks.key_wait:g} s; retry shortly",
            )
        if jwk is None:
            return Refusal("unknown_key", "the token is not signed by a key its issuer publishes")
        if jwk.get("alg", alg) != alg:
            return Refusal("algorithm", f"the token says {alg}, but its key is for {jwk.get('alg')}")
        try:
            key = jwt.PyJWK(jwk, algorithm=alg)
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                issuer=self.issuer,
                leeway=self.skew,
                options={"require": ["exp", "iss"], "verify_aud": False},  # the audience is compared canonically below
            )
        except jwt.ExpiredSignatureError:
            return Refusal("expired", "the token has expired; get a new one")
        except jwt.ImmatureSignatureError:
            return Refusal("not_yet_valid", "the token is not valid yet (nbf or iat is ahead of this server's clock)")
        except jwt.InvalidIssuerError:
            return Refusal("wrong_issuer", f"the token was not issued by {self.issuer}")
        except jwt.InvalidSignatureError:
            return Refusal("bad_signature", "the token's signature does not verify")
        except jwt.PyJWTError as exc:
            return Refusal("malformed", f"the token is not valid: {str(exc)[:200]}")
        accepted = self._accept(token, claims, introspected=False)
        if isinstance(accepted, AccessToken):
            self._hold(token, accepted, kid, jwk)
        return accepted

    def _accept(self, token: str, claims: Mapping[str, Any], *, introspected: bool) -> AccessToken | Refusal:
        if introspected:
            if claims.get("iss", self.issuer) != self.issuer:
                return Refusal("wrong_issuer", f"the token was not issued by {self.issuer}")
            exp = claims.get("exp")
            if isinstance(exp, int | float) and exp + self.skew < time.time():
                return Refusal("expired", "the token has expired; get a new one")
        aud = audiences(claims)
        if self._resource not in {canonical(a) for a in aud}:
            shown = ", ".join(a[:100] for a in aud[:3]) or "no audience"
            return Refusal("wrong_audience", f"the token is for {shown}, not for this server ({self.resource})")
        client_id = claims.get("client_id", claims.get("azp"))
        subject = claims.get("sub")
        exp = claims.get("exp")
        return AccessToken(
            token=token,
            client_id=client_id if isinstance(client_id, str) else "",
            scopes=scopes_of(claims),
            expires_at=int(exp) if isinstance(exp, int | float) else None,
            resource=self.resource,
            subject=subject if isinstance(subject, str) else None,
            claims=dict(claims),
        )

    def _count(self, refusal: Refusal) -> None:
        """One log line per window, with counts by reason: a client retrying a bad token must not flood the log."""
        self.refused[refusal.reason] += 1
        self._unlogged[refusal.reason] += 1
        log.debug("mcp.token_refused", reason=refusal.reason, description=refusal.description)
        if time.monotonic() - self._logged_at >= REFUSALS_LOGGED_EVERY:
            log.warning("mcp.tokens_refused", window_s=REFUSALS_LOGGED_EVERY, **dict(self._unlogged))
            self._unlogged.clear()
            self._logged_at = time.monotonic()

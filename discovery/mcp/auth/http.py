"""`toolreg mcp --http` as an OAuth 2.1 resource server: the metadata route, the bearer check and how it is assembled.

What the MCP authorization specification asks of an HTTP server, built on
the SDK's pieces where they fit:

- Protected Resource Metadata (RFC 9728) at
  `/.well-known/oauth-protected-resource/mcp` (the SDK's route: the path of
  the resource inserted after the well-known prefix) and at
  `/.well-known/oauth-protected-resource` (the root, which clients of older
  revisions look up), naming the one authorization server and the scopes
  the access policy knows. Both are public (no token), behind the same
  Host/Origin check as everything else.
- `OAuthGuard` in front of MCP: a request without a token gets 401 with
  `WWW-Authenticate: Bearer resource_metadata="...", scope="..."` (no
  error code, as RFC 6750 asks when no credentials were sent); a refused
  token gets 401 with `error="invalid_token"` and a description saying why
  (expired, another audience, an unknown key...); a valid token missing the
  policy's `required-scopes` gets 403 with `error="insufficient_scope"`
  and the scopes to ask for. A valid one passes with the SDK's
  `AuthenticatedUser` in the ASGI scope, exactly where the SDK's own
  `AuthenticationMiddleware` puts it, so the SDK binds each session to its
  principal (another token cannot drive someone else's session) and the
  front reads the caller per request.

The SDK's `RequireAuthMiddleware` is not used: it answers every failure
"Authentication required" with `error="invalid_token"` (also when no token
was sent) and never a `scope`, so a client could not tell an expired token
from one for another server.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from mcp.server.auth.handlers.metadata import ProtectedResourceMetadataHandler
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import build_resource_metadata_url, cors_middleware
from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl
from starlette.authentication import AuthCredentials
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from toolservice_base.logs import get_logger

from ..settings import CLOCK_SKEW, TOKEN_ALGORITHMS
from .issuer import MIN_REFETCH, IssuerError, IssuerMetadata, JwksCache, check_url, http_client
from .tokens import Introspection, Refusal, TokenChecker

log = get_logger("discovery.mcp")

WELL_KNOWN = "/.well-known/oauth-protected-resource"


@dataclass(frozen=True)
class OAuthSettings:
    """What `toolreg mcp --http` needs to be a resource server; `resource` None: the URL it serves."""

    issuer: str
    resource: str | None = None
    jwks_uri: str | None = None
    introspection_client: str | None = None
    introspection_secret: str | None = None
    algorithms: tuple[str, ...] = TOKEN_ALGORITHMS
    skew: float = CLOCK_SKEW
    required_scopes: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    """Every scope the access policy names: the metadata's `scopes_supported`."""
    jwks_min_refetch: float = MIN_REFETCH
    """Seconds between refetches of the key set for an unknown key id (`issuer.MIN_REFETCH`)."""


@dataclass(frozen=True)
class ResourceServer:
    """A started resource server: its token checker and what its routes and challenges say."""

    settings: OAuthSettings
    resource: str
    checker: TokenChecker

    @property
    def metadata_url(self) -> str:
        return str(build_resource_metadata_url(AnyHttpUrl(self.resource)))

    def routes(self) -> list[Route]:
        """The metadata document at the path-inserted URL and at the root, served by the SDK's handler.

        The document is validated from strings, not built from `AnyHttpUrl`s: those gain a trailing slash on a
        path-less URL, and the SDK's client compares the issuer character for character (RFC 8414).
        """
        document = ProtectedResourceMetadata.model_validate(
            {
                "resource": self.resource,
                "authorization_servers": [self.settings.issuer],
                "scopes_supported": list(self.settings.scopes) or None,
                "resource_name": "toolreg",
            }
        )
        handler = cors_middleware(ProtectedResourceMetadataHandler(document).handle, ["GET", "OPTIONS"])
        paths = dict.fromkeys([urlsplit(self.metadata_url).path, WELL_KNOWN])
        return [Route(path, endpoint=handler, methods=["GET", "OPTIONS"]) for path in paths]

    def guard(self, app: ASGIApp) -> OAuthGuard:
        return OAuthGuard(app, self)


@contextlib.asynccontextmanager
async def resource_server(settings: OAuthSettings, served_url: str) -> AsyncIterator[ResourceServer]:
    """Discover the issuer, load its keys (or set up introspection), and keep them fresh while the block runs.

    Raises `IssuerError` (one line) when the issuer cannot be used: unreachable, metadata naming another issuer, no
    keys and no introspection credentials.
    """
    resource = check_url(settings.resource or served_url, "the MCP resource URI")
    async with http_client() as client, contextlib.AsyncExitStack() as stack:
        metadata = await IssuerMetadata.discover(client, settings.issuer)
        jwks_uri = settings.jwks_uri or metadata.jwks_uri
        jwks = JwksCache(client, jwks_uri, min_refetch=settings.jwks_min_refetch) if jwks_uri else None
        if jwks is not None:
            await jwks.start()
            stack.push_async_callback(jwks.close)
        introspection = None
        if settings.introspection_client and settings.introspection_secret:
            if metadata.introspection_endpoint is None:
                raise IssuerError(f"OAuth issuer {settings.issuer} publishes no introspection_endpoint")
            introspection = Introspection(
                client, metadata.introspection_endpoint, settings.introspection_client, settings.introspection_secret
            )
        if jwks is None and introspection is None:
            raise IssuerError(
                f"OAuth issuer {settings.issuer} publishes no jwks_uri: set TOOLREG_MCP_JWKS_URI, or the introspection "
                "client (TOOLREG_MCP_INTROSPECTION_CLIENT and _SECRET) for opaque tokens"
            )
        checker = TokenChecker(
            issuer=settings.issuer,
            resource=resource,
            algorithms=settings.algorithms,
            skew=settings.skew,
            jwks=jwks,
            introspection=introspection,
        )
        log.info(
            "mcp.oauth",
            issuer=settings.issuer,
            resource=resource,
            jwt=jwks is not None,
            introspection=introspection is not None,
        )
        yield ResourceServer(settings, resource, checker)


_UNSAFE = re.compile(r'[^\x20-\x7e]|["\\]')


def _quoted(text: str) -> str:
    """`text` as an RFC 6750 quoted-string: printable ASCII without quotes or backslashes (a token's `aud` is the
    caller's to choose)."""
    return _UNSAFE.sub("?", text)[:300]


class OAuthGuard:
    """ASGI wrapper: only requests bearing a valid access token for this resource reach MCP; metadata is public."""

    def __init__(self, app: ASGIApp, server: ResourceServer) -> None:
        self.app = app
        self.server = server
        self.required = set(server.settings.required_scopes)
        # Every scope the policy names (as `scopes_supported`): a client asks for all it may use at once, and the
        # authorization server grants what that client may have; a call outside them is a tool error, not a 403.
        self._hint = " ".join(server.settings.scopes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(WELL_KNOWN):
            await self.app(scope, receive, send)
            return
        given = next((value for key, value in scope["headers"] if key == b"authorization"), b"")
        kind, _, credential = given.decode("latin-1").partition(" ")
        if kind.lower() != "bearer" or not credential.strip():
            await self._challenge(send, 401, None, "send Authorization: Bearer <access token>", self._hint)
            return
        checked = await self.server.checker.check(credential.strip())
        if isinstance(checked, Refusal):
            await self._challenge(send, 401, "invalid_token", checked.description, self._hint)
            return
        missing = sorted(self.required - set(checked.scopes))
        if missing:
            await self._challenge(
                send, 403, "insufficient_scope", f"this server needs scope {' '.join(missing)}", " ".join(missing)
            )
            return
        await self._pass(checked, scope, receive, send)

    async def _pass(self, token: AccessToken, scope: Scope, receive: Receive, send: Send) -> None:
        user = AuthenticatedUser(token)
        reset = auth_context_var.set(user)  # what the SDK's AuthContextMiddleware does, for `get_access_token()`
        try:
            await self.app({**scope, "user": user, "auth": AuthCredentials(token.scopes)}, receive, send)
        finally:
            auth_context_var.reset(reset)

    async def _challenge(self, send: Send, status: int, error: str | None, description: str, scopes: str) -> None:
        parts = [f'resource_metadata="{_quoted(self.server.metadata_url)}"']
        if error is not None:
            parts = [f'error="{error}"', f'error_description="{_quoted(description)}"', *parts]
        if scopes:
            parts.append(f'scope="{_quoted(scopes)}"')
        body = json.dumps({"error": error or "invalid_request", "error_description": description}).encode() + b"\n"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", f"Bearer {', '.join(parts)}".encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class BearerTokenGuard:
    """ASGI wrapper: HTTP requests without `Authorization: Bearer <token>` get 401 and never reach MCP."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._authorized(scope):
            body = json.dumps(
                {"error": "invalid_token", "error_description": "send Authorization: Bearer <token>"}
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", b'Bearer error="invalid_token"'),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        given = next((value for key, value in scope["headers"] if key == b"authorization"), b"")
        scheme, _, credential = given.partition(b" ")
        # Constant time in the token's content: how long a refusal takes says nothing about how close a guess was.
        return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self._token)


def scopes_named(required: Sequence[str], policy_scopes: Sequence[str]) -> tuple[str, ...]:
    """`scopes_supported`: the required scopes first, then the policy's others, once each."""
    return tuple(dict.fromkeys([*required, *policy_scopes]))

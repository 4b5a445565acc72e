"""What the MCP front (`toolreg mcp`) reads from the environment: its bearer token or OAuth resource server, its
access policy, rate limit and audit trail, and how long its HTTP sessions live.

Its flags, where it has them, win (`discovery.cli.mcp`). The registry reads `audit_topic` too: the page counts
calls per caller from the audit topic when the fronts publish on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from toolservice_base.errors import SettingsError
from toolservice_base.variables import FromEnv, flag, names, number, path, setting, text, whole

TOKEN_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
"""Asymmetric JWS algorithms only: a key published in a JWKS is public, so an HMAC (`HS*`) token checked against one
could be forged by anyone, and `none` is no signature."""
CLOCK_SKEW = 30.0
MAX_CLOCK_SKEW = 300.0


def algorithms(name: str, value: str) -> tuple[str, ...]:
    """Comma-separated JWS algorithms, each one of `TOKEN_ALGORITHMS`."""
    chosen = names(name, value)
    unsafe = [a for a in chosen if a not in TOKEN_ALGORITHMS]
    if unsafe:
        raise SettingsError(
            f"{name} names {', '.join(unsafe)}: access tokens are checked against the issuer's "
            f"public keys, so only {', '.join(TOKEN_ALGORITHMS)} may be allowed"
        )
    return chosen or TOKEN_ALGORITHMS


@dataclass(frozen=True)
class McpSettings(FromEnv):
    """The MCP front's settings; None where the front's own default (or none at all) applies."""

    token: str | None = setting(
        "TOOLREG_MCP_TOKEN", text, None, "the bearer token `toolreg mcp --http` asks for (unless --token-file)"
    )
    oauth_issuer: str | None = setting(
        "TOOLREG_MCP_OAUTH_ISSUER", text, None, "be an OAuth 2.1 resource server for access tokens of this issuer"
    )
    resource: str | None = setting(
        "TOOLREG_MCP_RESOURCE",
        text,
        None,
        "the front's canonical resource URI (tokens' audience); None: the URL served",
    )
    jwks_uri: str | None = setting(
        "TOOLREG_MCP_JWKS_URI", text, None, "where the issuer's signing keys are; None: its metadata's `jwks_uri`"
    )
    introspection_client: str | None = setting(
        "TOOLREG_MCP_INTROSPECTION_CLIENT", text, None, "the client id opaque tokens are introspected as (RFC 7662)"
    )
    introspection_secret: str | None = setting("TOOLREG_MCP_INTROSPECTION_SECRET", text, None, "that client's secret")
    token_algorithms: tuple[str, ...] = setting(
        "TOOLREG_MCP_TOKEN_ALGORITHMS",
        algorithms,
        TOKEN_ALGORITHMS,
        "comma-separated JWS algorithms an access token may be signed with; asymmetric only",
    )
    clock_skew: float = setting(
        "TOOLREG_MCP_CLOCK_SKEW",
        number("seconds", 0, MAX_CLOCK_SKEW),
        CLOCK_SKEW,
        "seconds a token's `exp` and `nbf` may be off by (0 to 300)",
    )
    policy: Path | None = setting(
        "TOOLREG_MCP_POLICY",
        path,
        None,
        "the access policy (scopes and claims to tools); None: every token, every tool",
    )
    rate_limit: float | None = setting(
        "TOOLREG_MCP_RATE_LIMIT",
        number("calls per second", 0.001, 1_000_000),
        None,
        "tool calls per second each caller may make through the front; None: no limit",
    )
    audit_topic: bool = setting(
        "TOOLREG_MCP_AUDIT_TOPIC", flag, False, "every call through the front is also published on the audit topic"
    )
    audit_arguments: bool = setting(
        "TOOLREG_MCP_AUDIT_ARGUMENTS", flag, False, "audit records carry the call's arguments"
    )
    audit_key: Path | None = setting(
        "TOOLREG_MCP_AUDIT_KEY",
        path,
        None,
        "the front's Ed25519 key file (`toolreg keygen`) its audit records are signed and chained with; None: unsigned",
    )
    session_idle: float = setting(
        "TOOLREG_MCP_SESSION_IDLE",
        number("seconds", 1, 7 * 86400),
        300.0,
        "seconds an MCP HTTP session may go without a request before it is closed and forgotten",
    )
    max_sessions: int = setting(
        "TOOLREG_MCP_MAX_SESSIONS",
        whole(" of sessions"),
        1000,
        "MCP HTTP sessions open at once; a new one past it is refused (503)",
    )

    def __post_init__(self) -> None:
        if not (math.isfinite(self.session_idle) and self.session_idle > 0):
            raise SettingsError(f"{self.env('session_idle')}={self.session_idle!r}: give a positive number of seconds")
        if self.max_sessions < 1:
            raise SettingsError(f"{self.env('max_sessions')}={self.max_sessions!r}: give at least 1")

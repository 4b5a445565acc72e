"""What the MCP front asks of every request: who is calling, what it may see and call, how fast, and the record.

One `Gate` per front. The caller comes from the OAuth token the HTTP guard
put in the request (`Caller.of_token`), else it is the front's one `local`
caller: `stdio` (the client that spawned the process), `bearer-token` (the
static token) or `anonymous` (loopback without a token). The access policy
applies to token callers; a local caller may call every tool the front
serves: whoever can reach a local front already runs on its machine, or holds its one token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser

from .audit import AuditTrail
from .limits import RateLimiter
from .policy import AccessPolicy, Caller, Rights

INSUFFICIENT_SCOPE_META = "toolreg/insufficient-scope"
"""`_meta` key of a refused call's tool error: `{"error": "insufficient_scope", "scope": "..."}` (the scopes that would
grant the tool, as the specification's 403 challenge would name them), for a client that steps up on its own."""
RETRY_AFTER_META = "toolreg/retry-after"
"""`_meta` key of a rate-limited call's tool error: seconds until the caller may call again."""


@dataclass
class Gate:
    workspace: str
    policy: AccessPolicy | None = None
    limiter: RateLimiter | None = None
    audit: AuditTrail | None = None
    local: Caller = field(default_factory=lambda: Caller("stdio"))

    def __post_init__(self) -> None:
        if self.audit is None:
            self.audit = AuditTrail(self.workspace)

    @property
    def trail(self) -> AuditTrail:
        assert self.audit is not None
        return self.audit

    def caller(self, request: Any) -> Caller:
        """The caller of one request (`ServerRequestContext.request`: the HTTP request, None on stdio)."""
        scope = getattr(request, "scope", None)
        user = scope.get("user") if isinstance(scope, dict) else None
        return Caller.of_token(user.access_token) if isinstance(user, AuthenticatedUser) else self.local

    def rights(self, caller: Caller) -> Rights:
        if self.policy is None or not caller.authenticated:
            return Rights((), self.workspace, everything=True)
        return self.policy.rights(caller, self.workspace)

    def denial(self, caller: Caller, name: str, *names: str) -> tuple[str, str]:
        """The tool error's text for a call `caller` may not make, and the scopes that would grant it ('' if none)."""
        assert self.policy is not None
        needed = self.policy.needed(self.workspace, name, *names)
        scopes = " ".join(self.policy.scopes_granting(self.workspace, name, *names))
        held = ", ".join(sorted(caller.scopes)) or "none"
        if not needed:
            return f"insufficient_scope: no rule of the access policy grants tool {name!r} in this workspace", scopes
        return (
            f"insufficient_scope: tool {name!r} needs {' or '.join(needed)}; this token's scopes: {held}",
            scopes,
        )

    def wait(self, caller: Caller) -> float:
        """Seconds `caller` must wait before this call (0: go now), by the per-caller rate limit."""
        return self.limiter.take(caller.subject) if self.limiter is not None else 0.0

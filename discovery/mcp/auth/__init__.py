"""Who is calling through the MCP front: OAuth 2.1 resource server (`http`, `tokens`, `issuer`), per-tool access
policy (`policy`), per-caller rate limits (`limits`) and the audit trail (`audit`), brought together per request by
`gate.Gate`."""

from .audit import AuditTrail
from .gate import Gate
from .http import OAuthSettings, ResourceServer, resource_server
from .issuer import IssuerError
from .limits import RateLimiter
from .policy import AccessPolicy, AccessPolicyError, Caller

__all__ = [
    "AccessPolicy",
    "AccessPolicyError",
    "AuditTrail",
    "Caller",
    "Gate",
    "IssuerError",
    "OAuthSettings",
    "RateLimiter",
    "ResourceServer",
    "resource_server",
]

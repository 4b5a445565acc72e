"""Which writes of tools the config store takes when its trust policy covers the config queue.

A trust policy guards the announcements; without more, anyone who may send
on the config queue can write a `tool-service` and a `tool` item by hand
and have agents call them (listed as static). With `"config-writes":
"signed"` in the policy, the store takes a put or delete touching `tool` or
`tool-service` items only if it is signed, within `SIGNATURE_WINDOW` of the
store's clock, by one of the policy's operator keys (Ed25519, `toolreg config
put --signing-key`), or by the registry (a MAC under the replicas' group
key). A signed write seen again (a client's resend, or a copy replayed) gets
the answer the first one got, and changes nothing.

A registry in the store's own process asks it directly (`LocalRequests`) and
needs no signature.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from discovery.replicas import GroupKey
from toolservice_base.logs import get_logger
from toolservice_base.schemas import ConfigRequest, ConfigResponse, ErrorBody
from toolservice_base.signing import (
    CONFIG_SIGNATURE,
    SIGNATURE_WINDOW,
    check_signed_at,
    split_config_signature,
    verify_config_request,
)

from .operations import TOOL_TYPES

log = get_logger("discovery.store")

REMEMBERED = 4096
"""Signed writes whose answers are kept, so a resend (or a replay) within the window is answered, not done again."""
REFUSAL = "not-authorized"
"""The error type of a refused write."""


@dataclass
class ConfigWriteGuard:
    """The operator keys (by key id) a write of tools must be signed with, and the registry's key."""

    operators: Mapping[str, Ed25519PublicKey]
    names: Mapping[str, str]
    """Key id -> the operator's name in the policy, for the log."""
    topicspace: str
    registry: GroupKey | None = None
    window: float = SIGNATURE_WINDOW
    _answered: OrderedDict[str, ConfigResponse] = field(default_factory=OrderedDict, repr=False)

    def covers(self, request: ConfigRequest) -> bool:
        """A write that touches `tool` or `tool-service` items."""
        if request.operation not in ("put", "delete"):
            return False
        touched = {value.type for value in request.values} | {key.type for key in request.keys}
        return bool(touched & set(TOOL_TYPES))

    def refusal(self, request: ConfigRequest, now: float | None = None) -> str | None:
        """None if the write is vouched for; else why it is refused, in one line."""
        parts = split_config_signature(request.signature)
        if parts is None:
            return (
                "the trust policy covers the config queue: writes of tool and tool-service items must be signed by an"
                " operator key of the policy (toolreg config put --signing-key KEY)"
            )
        scheme, kid, signed_at, _ = parts
        stale = check_signed_at(signed_at, time.time() if now is None else now, self.window)
        if stale is not None:
            return f"refused a signed write of tools: {stale}"
        if scheme == CONFIG_SIGNATURE:
            key = self.operators.get(kid)
            if key is None:
                return f"the write is signed by key {kid}, which is not an operator key of the trust policy"
            if not verify_config_request(request, key):
                return f"the signature by operator {self.names.get(kid, kid)!r} does not match the write"
            return None
        if self.registry is None:
            return "the write is signed for a registry, but this store holds no group key to check it with"
        forged = self.registry.check_config(request, self.topicspace)
        return None if forged is None else f"the registry's signature does not check: {forged}"

    async def serve(self, request: ConfigRequest, serve: Callable[[], Awaitable[ConfigResponse]]) -> ConfigResponse:
        """Refuse a write of tools nobody vouches for (logged), answer a signed one seen before as it was answered,
        and `serve` the rest."""
        refused = self.refusal(request)
        if refused is not None:
            log.warning("config.write_refused", operation=request.operation, reason=refused)
            return ConfigResponse(error=ErrorBody(type=REFUSAL, message=refused))
        if (seen := self.answered(request)) is not None:
            return seen  # a resend of a signed write, or a copy of it: answered, not done again
        response = await serve()
        self.remember(request, response)
        return response

    def answered(self, request: ConfigRequest) -> ConfigResponse | None:
        """The answer a signed write already got (a resend, a replay), if it came before."""
        return self._answered.get(request.signature or "")

    def remember(self, request: ConfigRequest, response: ConfigResponse) -> None:
        if not request.signature:
            return
        self._answered[request.signature] = response
        while len(self._answered) > REMEMBERED:
            self._answered.popitem(last=False)

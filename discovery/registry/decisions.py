"""Which operator decisions (`toolreg approve`, `reject`) the registry takes when its trust policy has
`"config-writes": "signed"`.

Under that policy what the registry owns, only the registry or a signed
operator writes. A held definition is decided on through the registry's
query API, on a queue every role that sends requests (an agent's, too) may
send on: so the registry takes an `approve` or `reject` only when an operator
key of the policy signed it (`toolreg approve --signing-key`), for this
topicspace, before it expired, and once. Without that setting, decisions are
left to the broker's permissions: whoever may send on the query queue may decide.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from toolservice_base.signing import (
    CONFIG_SIGNATURE,
    DECISION_DOMAIN,
    SigningError,
    check_expiry,
    read_config_signature,
    verify_config_request,
)

from .protocol import RegistryRequest
from .trust import TrustPolicy

__all__ = ["DECISIONS", "SignedDecisions"]

DECISIONS = ("approve", "reject")
UNSIGNED = (
    "the trust policy has config-writes signed: `toolreg approve` and `reject` must be signed by an operator key of"
    " the policy (--signing-key KEY)"
)


class SignedDecisions:
    """The check, and the nonces of the decisions taken while their signatures are good (a copy is refused; a
    registry that takes over has not seen them, but the decision they carried is no longer pending there)."""

    def __init__(self, trust: TrustPolicy | None, topicspace: str) -> None:
        self._trust = trust if trust is not None and trust.config_writes == "signed" else None
        self._topicspace = topicspace
        self._taken: OrderedDict[str, float] = OrderedDict()

    def refusal(self, request: RegistryRequest, now: float | None = None) -> str | None:
        """None if the registry may act on `request`; else why not, in one line."""
        if self._trust is None or request.operation not in DECISIONS:
            return None
        if not request.signature:
            return UNSIGNED
        moment = time.time() if now is None else now
        try:
            signature = read_config_signature(request.signature)
        except SigningError as exc:
            return f"refused a signed {request.operation}: {exc}"
        if signature.topicspace != self._topicspace:
            return f"refused a signed {request.operation}: it is signed for topicspace {signature.topicspace!r}"
        expired = check_expiry(signature.expires, moment)
        if expired is not None:
            return f"refused a signed {request.operation}: {expired}"
        key = self._trust.operators.get(signature.key_id)
        if signature.scheme != CONFIG_SIGNATURE or key is None:
            return f"the {request.operation} is signed by key {signature.key_id}, not an operator key of the policy"
        if not verify_config_request(request, key.public_key, self._topicspace, DECISION_DOMAIN):
            return f"the signature by operator {key.name!r} does not match the {request.operation}"
        while self._taken and next(iter(self._taken.values())) < moment:
            self._taken.popitem(last=False)
        if signature.nonce in self._taken:
            return f"refused a copy of a signed {request.operation} already taken: sign it again"
        self._taken[signature.nonce] = float(signature.expires)
        return None

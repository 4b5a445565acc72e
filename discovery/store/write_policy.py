"""Which writes the config store takes when its trust policy covers the config queue.

A trust policy guards the announcements; without more, anyone who may send
on the config queue can write a `tool-service` and a `tool` item by hand
and have agents call them (listed as static), or write the registry's own
records (a `discovery-pin` naming a held definition, and the
`pending-definition` deleted: the change is served unapproved). With
`"config-writes": "signed"` in the policy, what the registry owns only the
registry or a signed operator writes: the store takes a put or delete
touching `tool`, `tool-service`, `discovery`, `discovery-pin` or
`pending-definition` items, or any item of the registry's workspace
`_toolreg`, only if it is signed by one of the policy's operator keys
(Ed25519, `toolreg config put --signing-key`) or by the registry (a MAC under
the replicas' group key).

A signed write is signed whole and taken once: the signature covers the
topicspace and an expiry (`toolservice_base.signing`), its base64 is read
strictly, and its nonce is remembered until it expires. On a replicated store
the nonce travels in the write's log entry (`SignedRequestId`), so every
replica knows it was taken (`log_state.StoreState`): a copy sent again, after
a failover or not, is refused; the sender's own resend (the same request id)
gets the answer the first one got, and changes nothing.

A registry in the store's own process asks it directly (`LocalRequests`) and
needs no signature.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from discovery.replicas import GroupKey
from toolservice_base.logs import get_logger
from toolservice_base.schemas import ConfigRequest, ConfigResponse, ErrorBody
from toolservice_base.signing import (
    CONFIG_SIGNATURE,
    SIGNATURE_WINDOW,
    ConfigSignature,
    SigningError,
    check_expiry,
    read_config_signature,
    verify_config_request,
)

from .operations import TOOL_TYPES

log = get_logger("discovery.store")

REFUSAL = "not-authorized"
"""The error type of a refused write."""
REGISTRY_TYPES = ("discovery", "discovery-pin", "pending-definition")
"""The registry's records in a workspace: who owns each tool, the pinned definitions, the held ones
(`discovery.registry.merge.RECORD_TYPE`, `pin_rules.PIN_TYPE`, `pin_rules.PENDING_TYPE`)."""
REGISTRY_WORKSPACE = "_toolreg"
"""The registry's reserved workspace (`discovery.registry.store_writes.PROBE_WORKSPACE`): all its items are its own."""
GUARDED_TYPES = (*TOOL_TYPES, *REGISTRY_TYPES)
UNSIGNED = (
    "the trust policy covers the config queue: writes of tool and tool-service items, and of the registry's own"
    f" ({', '.join(REGISTRY_TYPES)}, workspace {REGISTRY_WORKSPACE}), must be signed by an operator key of the policy"
    " (toolreg config put --signing-key KEY)"
)


@dataclass(frozen=True)
class Taken:
    """A signed request the store took: until when its signature is good, the version it made, and the id of the
    request that carried it (a resend carries the same)."""

    expires: float
    version: int
    request: str | None


class TakenRequests:
    """Signed requests taken, by nonce, while their signatures are good.

    Only the unexpired ones need remembering: a copy of an expired one is
    refused for its expiry, whatever this memory holds. So it holds at most
    the signed writes of the last two signature windows, never more.
    """

    def __init__(self) -> None:
        self._taken: OrderedDict[str, Taken] = OrderedDict()

    def take(self, nonce: str, taken: Taken, now: float | None = None) -> None:
        self.forget_expired(now)
        if taken.expires >= (time.time() if now is None else now):
            self._taken[nonce] = taken

    def get(self, nonce: str, now: float | None = None) -> Taken | None:
        taken = self._taken.get(nonce)
        return taken if taken is not None and taken.expires >= (time.time() if now is None else now) else None

    def forget_expired(self, now: float | None = None) -> None:
        """Drop the oldest ones once expired (taken in about the order they expire)."""
        moment = time.time() if now is None else now
        while self._taken and next(iter(self._taken.values())).expires < moment:
            self._taken.popitem(last=False)

    def items(self, now: float | None = None) -> Iterator[tuple[str, Taken]]:
        self.forget_expired(now)
        return iter(list(self._taken.items()))


@runtime_checkable
class SignedLog(Protocol):
    """A journal that knows which signed requests its log holds (the replicated store's, every replica's)."""

    def taken(self, nonce: str) -> Taken | None: ...


class SignedRequestId(str):
    """The id of a signed request on its way to the journal: its sender's request id, carrying the signature's nonce
    and expiry too, so the log entry keeps them (`log_state.entry_payload`) and every replica knows it was taken."""

    nonce: str
    expires: float

    @classmethod
    def of(cls, request_id: str | None, signature: ConfigSignature) -> SignedRequestId:
        made = cls(request_id or f"signed:{signature.nonce}")
        made.nonce, made.expires = signature.nonce, float(signature.expires)
        return made


@dataclass
class ConfigWriteGuard:
    """The operator keys (by key id) a guarded write must be signed with, and the registry's key."""

    operators: Mapping[str, Ed25519PublicKey]
    names: Mapping[str, str]
    """Key id -> the operator's name in the policy, for the log."""
    topicspace: str
    registry: GroupKey | None = None
    window: float = SIGNATURE_WINDOW
    _taken: TakenRequests = field(default_factory=TakenRequests, repr=False)
    _in_flight: dict[str, str | None] = field(default_factory=dict, repr=False)

    def covers(self, request: ConfigRequest, queue_workspace: str | None = None) -> bool:
        """A write that touches `tool`, `tool-service` or the registry's items, or any item of its workspace."""
        if request.operation not in ("put", "delete"):
            return False
        workspace = queue_workspace if queue_workspace is not None else request.workspace
        touched = {value.type for value in request.values} | {key.type for key in request.keys}
        return workspace == REGISTRY_WORKSPACE or bool(touched & set(GUARDED_TYPES))

    def refusal(
        self, request: ConfigRequest, now: float | None = None, queue_workspace: str | None = None
    ) -> str | None:
        """None if the write is vouched for; else why it is refused, in one line."""
        judged = self.judge(request, now, queue_workspace)
        return judged if isinstance(judged, str) else None

    def judge(
        self, request: ConfigRequest, now: float | None = None, queue_workspace: str | None = None
    ) -> ConfigSignature | str:
        """The signature that vouches for the write; else why it is refused, in one line."""
        if not request.signature:
            return UNSIGNED
        try:
            signature = read_config_signature(request.signature)
        except SigningError as exc:
            return f"refused a signed write: {exc}"
        if signature.topicspace != self.topicspace:
            return (
                f"refused a signed write: it is signed for topicspace {signature.topicspace!r}, not this store's"
                f" {self.topicspace!r} (a copy from another topicspace?)"
            )
        if queue_workspace is not None and queue_workspace != request.workspace:
            return (
                f"refused a signed write: it is signed for workspace {request.workspace!r} but came on workspace"
                f" {queue_workspace!r}'s queue; send it on the system queue"
            )
        expired = check_expiry(signature.expires, time.time() if now is None else now, self.window)
        if expired is not None:
            return f"refused a signed write: {expired}"
        if signature.scheme == CONFIG_SIGNATURE:
            key = self.operators.get(signature.key_id)
            if key is None:
                return (
                    f"the write is signed by key {signature.key_id}, which is not an operator key of the trust policy"
                )
            if not verify_config_request(request, key, self.topicspace):
                name = self.names.get(signature.key_id, signature.key_id)
                return f"the signature by operator {name!r} does not match the write"
            return signature
        if self.registry is None:
            return "the write is signed for a registry, but this store holds no group key to check it with"
        forged = self.registry.check_config(request, self.topicspace)
        return signature if forged is None else f"the registry's signature does not check: {forged}"

    async def serve(
        self,
        request: ConfigRequest,
        serve: Callable[[str], Awaitable[ConfigResponse]],
        *,
        queue_workspace: str | None = None,
        request_id: str | None = None,
        journal: object = None,
    ) -> ConfigResponse:
        """Refuse a guarded write nobody vouches for, or a copy of a signed one already taken (logged); answer the
        sender's resend as the first was answered; `serve` the rest with the request id the journal logs it under
        (`SignedRequestId`). `journal`: the store's, which knows the signed requests of the replicated log."""
        judged = self.judge(request, queue_workspace=queue_workspace)
        if isinstance(judged, str):
            return self._refused(request, judged)
        nonce = judged.nonce
        logged = journal.taken(nonce) if isinstance(journal, SignedLog) else None
        taken = self._taken.get(nonce) or logged
        if taken is not None:
            if request_id is not None and taken.request == request_id:
                return ConfigResponse(version=taken.version)  # the sender's resend: answered, not done again
            return self._refused(
                request,
                f"refused a copy of a signed write already taken (at version {taken.version}): a signed write is"
                " taken once; sign it again to make it again",
            )
        if nonce in self._in_flight and self._in_flight[nonce] != request_id:
            return self._refused(
                request, "refused a copy of a signed write being taken now: a signed write is taken once"
            )
        self._in_flight[nonce] = request_id
        try:
            response = await serve(SignedRequestId.of(request_id, judged))
        finally:
            self._in_flight.pop(nonce, None)
        if response.error is None:
            self._taken.take(nonce, Taken(float(judged.expires), response.version, request_id))
        return response

    def _refused(self, request: ConfigRequest, reason: str) -> ConfigResponse:
        log.warning("config.write_refused", operation=request.operation, reason=reason)
        return ConfigResponse(error=ErrorBody(type=REFUSAL, message=reason))

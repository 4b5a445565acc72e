"""`RegistryClient`: the registry's query API as typed calls.

Requests go to `tool-registry` with `RegistryRequest` bodies and come back as
`RegistryResponse`. A registry that does not answer is the one failure a user
meets most (nothing started yet), so it gets its own exception whose message
says what to run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from discovery.errors import RegistryQueryError, RegistryUnavailable
from toolservice_base.errors import RequestTimeout
from toolservice_base.rpc import RequestClient
from toolservice_base.transport import Transport

from .protocol import (
    NameConflict,
    PendingChange,
    RegistryOperation,
    RegistryRequest,
    RegistryResponse,
    Rejection,
    ToolStatus,
)

DEFAULT_TIMEOUT = 5.0
PAGE_LIMIT = 5_000
"""Tools asked for per page of `list`; the registry also stops a page at about `PAGE_BYTES`."""


@dataclass(frozen=True)
class Listing:
    tools: list[ToolStatus]
    held: list[str]
    """Services whose deletions self-preservation is holding."""
    pinning: bool = False
    """The registry pins definitions (`--pin-definitions`)."""


@dataclass(frozen=True)
class Pending:
    changes: list[PendingChange]
    pinning: bool
    """False: the registry does not pin definitions, so nothing is ever held."""


@dataclass(frozen=True)
class Decision:
    change: PendingChange
    applied: bool
    """`approve`: the approved definition was in the store when the registry answered."""


Rejections = list[Rejection]
Conflicts = list[NameConflict]
Names = list[str]


class RegistryClient:
    """Query a running registry over Pulsar."""

    def __init__(
        self,
        connection: Transport,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        sign: Callable[[RegistryRequest], RegistryRequest] | None = None,
    ) -> None:
        """`sign`: signs each `approve` and `reject`, for a registry whose trust policy has `config-writes signed`
        (`toolservice_base.signing.sign_config_request` with `DECISION_DOMAIN`)."""
        self.timeout = timeout
        self.sign = sign
        self.page_limit = PAGE_LIMIT
        self._rpc = RequestClient(
            connection,
            connection.topics.registry_request,
            connection.topics.registry_response,
            name="registry-client",
            bulk=True,
        )

    async def start(self) -> "RegistryClient":
        await self._rpc.start()
        return self

    async def _call(
        self,
        operation: RegistryOperation,
        *,
        name: str | None = None,
        workspace: str | None = None,
        limit: int | None = None,
        after: str | None = None,
        digest: str | None = None,
    ) -> RegistryResponse:
        request = RegistryRequest(
            operation=operation, name=name, workspace=workspace, limit=limit, after=after, digest=digest
        )
        if self.sign is not None and operation in ("approve", "reject"):
            request = self.sign(request)
        try:
            body = await self._rpc.request(request, timeout=self.timeout)
        except RequestTimeout:
            raise RegistryUnavailable(
                f"the registry did not answer within {self.timeout:g}s; run `toolreg up` or `toolreg registry`"
            ) from None
        try:
            response = RegistryResponse.model_validate(body)
        except ValidationError as exc:
            raise RegistryQueryError(
                f"the registry sent a malformed response: {exc.errors()[0]['msg']}", "bad-response"
            ) from None
        if response.error is not None:
            raise RegistryQueryError(response.error.message, response.error.type)
        return response

    async def list(self, workspace: str | None = None) -> Listing:
        """Every tool's status, asked for in pages so no answer has to hold them all.

        Pages follow tool names; a tool that comes or goes while the pages
        are read may be missed or shown, as it would a moment later or earlier.
        A registry that does not page answers everything at once, without `more`.
        """
        tools: list[ToolStatus] = []
        after: str | None = None
        while True:
            response = await self._call("list", workspace=workspace, limit=self.page_limit, after=after)
            tools.extend(response.tools or [])
            if not response.more or not response.tools:
                return Listing(tools=tools, held=response.held or [], pinning=bool(response.pinning))
            after = response.tools[-1].name

    async def get(self, name: str, workspace: str | None = None) -> ToolStatus | None:
        """One tool's status, or None if no such tool is listed."""
        try:
            response = await self._call("get", name=name, workspace=workspace)
        except RegistryQueryError as exc:
            if exc.code == "not-found":
                return None
            raise
        return response.tool

    async def rejections(self) -> Rejections:
        return (await self._call("rejections")).rejections or []

    async def conflicts(self) -> Conflicts:
        return (await self._call("conflicts")).conflicts or []

    async def release(self) -> Names:
        """Confirm the deletions self-preservation holds; returns the services released."""
        return (await self._call("release")).released or []

    async def pending(self) -> Pending:
        """Held definition changes, of every workspace."""
        response = await self._call("pending")
        return Pending(changes=response.pending or [], pinning=bool(response.pinning))

    async def approve(self, name: str, workspace: str | None = None, digest: str | None = None) -> Decision:
        """Pin the definition offered for tool `name` (`digest`: only if it is that one); `RegistryQueryError` if
        nothing is pending."""
        response = await self._call("approve", name=name, workspace=workspace, digest=digest)
        return Decision(change=_decided(response), applied=bool(response.applied))

    async def reject(self, name: str, workspace: str | None = None, digest: str | None = None) -> Decision:
        """Keep tool `name`'s pin and refuse the offered definition from now on."""
        response = await self._call("reject", name=name, workspace=workspace, digest=digest)
        return Decision(change=_decided(response), applied=True)

    async def close(self) -> None:
        await self._rpc.close()

    async def __aenter__(self) -> "RegistryClient":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _decided(response: RegistryResponse) -> PendingChange:
    if response.decided is None:
        raise RegistryQueryError("the registry sent a malformed response: no decided change", "bad-response")
    return response.decided

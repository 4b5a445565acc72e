"""The config-store client: every process's way to read and write config items."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from pydantic import ValidationError

from .errors import ConfigConflict, ConfigError, ConfigRefused, RequestTimeout
from .logs import get_logger
from .rpc import DEFAULT_TIMEOUT, RequestClient
from .schemas import (
    MAX_PUSH_BYTES,
    ConfigPush,
    ConfigRequest,
    ConfigResponse,
    describe_validation_error,
)
from .transport import Envelope, Subscription, Transport

PushHandler = Callable[[ConfigPush], Awaitable[None]]
FIRST_ATTEMPT = 0.5

log = get_logger("toolservice_base.configclient")


_ERRORS: dict[str, type[ConfigError]] = {"conflict": ConfigConflict, "invalid": ConfigRefused}


def _config_request(**fields: Any) -> ConfigRequest:
    """A request the store would accept, or `ConfigRefused` with one line saying which field is wrong."""
    try:
        return ConfigRequest(**fields)
    except ValidationError as exc:
        raise ConfigRefused(f"refused before sending: {describe_validation_error(exc)}") from None


class ConfigClient:
    """Typed calls on the config store's request/response queues."""

    def __init__(self, connection: Transport, *, workspace: str = "default", timeout: float = DEFAULT_TIMEOUT) -> None:
        self._connection = connection
        self.workspace = workspace
        self.timeout = timeout
        self._resend = connection.capabilities.resend_on_silence
        self._rpc = RequestClient(
            connection, connection.topics.config_request, connection.topics.config_response, name="config-client", bulk=True
        )

    async def start(self) -> "ConfigClient":
        await self._rpc.start()
        return self

    async def _call(self, request: ConfigRequest, timeout: float | None = None) -> ConfigResponse:
        body = await self._request(request, timeout or self.timeout)
        try:
            response = ConfigResponse.model_validate(body)
        except ValidationError as exc:
            raise ConfigError(f"config store sent a malformed response: {exc.errors()[0]['msg']}") from None
        if response.error is not None:
            error_class = _ERRORS.get(response.error.type, ConfigError)
            raise error_class(response.error.message, response.error.type)
        return response

    async def _request(self, request: ConfigRequest, timeout: float) -> dict[str, Any]:
        """Send, and where the broker needs it resend on silence, within `timeout` overall.

        A non-persistent topic drops a message for a consumer whose permits
        have not reached the broker yet, which happens in the first moments
        after a store (re)subscribes (`Capabilities.resend_on_silence`). Every
        store operation is safe to repeat (a repeated put changes nothing; a
        repeated conditional write fails its precondition and the caller
        re-reads), so a lost request costs a short attempt, not the whole timeout.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        attempt = FIRST_ATTEMPT if self._resend else timeout
        while True:
            remaining = deadline - loop.time()
            try:
                return await self._rpc.request(request, timeout=min(attempt, remaining))
            except RequestTimeout:
                if deadline - loop.time() <= 0.01:
                    raise RequestTimeout(
                        f"the config store did not answer within {timeout:g}s; is it running (`toolreg up`)?"
                    ) from None
                log.debug("config.request_retry", operation=request.operation, after=attempt)
                attempt *= 2

    async def get(self, keys: Iterable[tuple[str, str]], *, workspace: str | None = None) -> dict[tuple[str, str], str]:
        """Values of the keys that exist; missing keys are simply absent."""
        return (await self.snapshot(keys, workspace=workspace))[1]

    async def snapshot(
        self, keys: Iterable[tuple[str, str]], *, workspace: str | None = None
    ) -> tuple[int, dict[tuple[str, str], str]]:
        """The store's version and the values of the keys that exist, from one answer.

        TrustGraph's store answers a missing key with a null value; ours leaves
        it out. Both come back here as absent.
        """
        request = _config_request(
            operation="get", workspace=workspace or self.workspace, keys=[{"type": t, "key": k} for t, k in keys]
        )
        response = await self._call(request)
        return response.version, {(v.type, v.key): v.value for v in response.values if v.value is not None}

    async def put(self, items: Iterable[tuple[str, str, str]], *, workspace: str | None = None) -> int:
        """Write all items atomically; returns the new version."""
        request = _config_request(
            operation="put",
            workspace=workspace or self.workspace,
            values=[{"type": t, "key": k, "value": v} for t, k, v in items],
        )
        return (await self._call(request)).version or 0

    async def apply(
        self,
        *,
        puts: Iterable[tuple[str, str, str]] = (),
        deletes: Iterable[tuple[str, str]] = (),
        expect: Iterable[tuple[str, str, str | None]] = (),
        workspace: str | None = None,
    ) -> int:
        """Puts and deletes in one transaction, guarded by `expect` preconditions.

        Raises `ConfigConflict` when a precondition fails; returns the version.
        """
        request = _config_request(
            operation="put",
            workspace=workspace or self.workspace,
            values=[{"type": t, "key": k, "value": v} for t, k, v in puts],
            keys=[{"type": t, "key": k} for t, k in deletes],
            expect=[{"type": t, "key": k, "value": v} for t, k, v in expect],
        )
        return (await self._call(request)).version or 0

    async def delete(self, keys: Iterable[tuple[str, str]], *, workspace: str | None = None) -> int:
        request = _config_request(
            operation="delete", workspace=workspace or self.workspace, keys=[{"type": t, "key": k} for t, k in keys]
        )
        return (await self._call(request)).version or 0

    async def list(self, item_type: str, *, workspace: str | None = None) -> list[str]:
        request = _config_request(operation="list", workspace=workspace or self.workspace, type=item_type)
        return list((await self._call(request)).directory or [])

    async def getvalues(self, item_type: str, *, workspace: str | None = None) -> dict[str, str]:
        request = _config_request(operation="getvalues", workspace=workspace or self.workspace, type=item_type)
        return {v.key: v.value for v in (await self._call(request)).values if v.value is not None}

    async def version(self, *, workspace: str | None = None, timeout: float | None = None) -> int:
        """The store's current version, cheaply (an empty `get`): for periodic change checks."""
        request = _config_request(operation="get", workspace=workspace or self.workspace)
        return (await self._call(request, timeout)).version or 0

    async def config(self, *, workspace: str | None = None, timeout: float | None = None) -> tuple[int, dict[str, dict[str, str]]]:
        """Everything in the workspace and the version it was read at."""
        request = _config_request(operation="config", workspace=workspace or self.workspace)
        response = await self._call(request, timeout)
        return response.version or 0, response.config or {}

    async def close(self) -> None:
        await self._rpc.close()


async def watch_config(connection: Transport, handler: PushHandler) -> Subscription:
    """Call `handler` with every config push; malformed or oversized pushes are dropped, logged with the reason.

    Anyone on the broker can publish on the notify topic, so the size is
    checked before parsing. A well-formed forged push costs the watcher one
    refetch from the store (the store, not the push, is the truth).
    """

    async def on_push(message: Envelope) -> None:
        data = message.data
        if len(data) > MAX_PUSH_BYTES:
            log.warning("config.push_rejected", reason=f"push is {len(data)} bytes; the limit is {MAX_PUSH_BYTES}")
            return
        try:
            push = ConfigPush.model_validate_json(data)
        except (ValidationError, ValueError) as exc:
            log.warning("config.push_rejected", reason=str(exc).splitlines()[0])
            return
        await handler(push)

    return await connection.subscribe(connection.topics.config_notify, on_push)

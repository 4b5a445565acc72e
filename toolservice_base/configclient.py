"""The config-store client: every process's way to read and write config items."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, Self

import immutables
from pydantic import ValidationError

from .errors import ChangesUnavailable, ConfigConflict, ConfigError, ConfigRefused, RequestTimeout
from .logs import get_logger
from .rpc import DEFAULT_CALL_TIMEOUT, RequestClient
from .schemas import (
    CHANGES_OPERATION,
    CHANGES_TOO_OLD,
    MAX_CONFIG_REQUEST_BYTES,
    MAX_ITEM_BYTES,
    MAX_PUSH_BYTES,
    ConfigPush,
    ConfigRequest,
    ConfigResponse,
    describe_validation_error,
    printable,
)
from .transport import Envelope, Subscription, Transport, encode

PushHandler = Callable[[ConfigPush], Awaitable[None]]
Rows = list[tuple[str, str | None]]
Types = list[str]
FIRST_ATTEMPT = 0.5
READ_ATTEMPTS = 8
"""Times a paged read starts over because the store's version moved between its pages."""
PAGE_LIMIT = 10_000
"""Items asked for per page; the store also stops a page at about `PAGE_BYTES`."""

log = get_logger("toolservice_base.configclient")


_ERRORS: dict[str, type[ConfigError]] = {
    "conflict": ConfigConflict,
    "invalid": ConfigRefused,
    CHANGES_TOO_OLD: ChangesUnavailable,
}
Delta = dict[str, dict[str, str | None]]
"""Changed items by type, then key: the value now, or None for a key deleted."""


def apply_changes(items: Mapping[str, Mapping[str, str]], delta: Delta) -> dict[str, immutables.Map[str, str]]:
    """`items` (by type, then key) with `delta` applied, each type a persistent map (`immutables.Map`): the new one
    shares all but the changed keys with the old, so applying a delta costs what it changed; `items` is left as it
    was. A type the delta does not name is kept as it is."""
    changed = {t: held if isinstance(held, immutables.Map) else immutables.Map(held) for t, held in items.items()}
    for item_type, keys in delta.items():
        held = changed.get(item_type)
        if held is None:
            continue
        with held.mutate() as mutation:
            for key, value in keys.items():
                if value is None:
                    mutation.pop(key, None)
                else:
                    mutation[key] = value
            changed[item_type] = mutation.finish()
    return changed


class Requests(Protocol):
    """How a `ConfigClient`'s requests reach a store: the config queues (`RequestClient`), or a store in the same
    process."""

    async def start(self) -> Any: ...

    async def request(self, request: ConfigRequest, *, timeout: float) -> dict[str, Any]: ...

    async def close(self) -> None: ...


def _config_request(**fields: Any) -> ConfigRequest:
    """A request the store would accept, or `ConfigRefused` with one line saying which field is wrong."""
    try:
        request = ConfigRequest(**fields)
    except ValidationError as exc:
        raise ConfigRefused(f"refused before sending: {describe_validation_error(exc)}") from None
    if request.values:
        _check_size(request)
    return request


def _check_size(request: ConfigRequest) -> None:
    """`ConfigRefused` for a write the broker or the store would refuse for its size, said in one line before
    sending."""
    for item in request.values:
        size = len(json.dumps(item.value))
        if size > MAX_ITEM_BYTES:
            raise ConfigRefused(
                f"refused before sending: {item.type}/{printable(item.key, 80)} is {size} bytes as JSON; the store"
                f" takes items up to {MAX_ITEM_BYTES} bytes (the broker's message limit): store it in parts, or keep it"
                " elsewhere and store a reference"
            )
    size = len(encode(request))
    if size > MAX_CONFIG_REQUEST_BYTES:
        raise ConfigRefused(
            f"refused before sending: the write is {size} bytes; the store takes at most {MAX_CONFIG_REQUEST_BYTES}"
            " bytes per request: write the items in smaller batches"
        )


class ConfigClient:
    """Typed calls on the config store's request/response queues."""

    def __init__(
        self,
        connection: Transport,
        *,
        workspace: str = "default",
        timeout: float = DEFAULT_CALL_TIMEOUT,
        requests: Requests | None = None,
        sign: Callable[[ConfigRequest], ConfigRequest] | None = None,
    ) -> None:
        """`requests`: another way to the store than its queues (a store in this process); None: the queues.
        `sign`: signs each write (put, delete) before it goes, for a store whose trust policy covers the config
        queue (`toolservice_base.signing.sign_config_request`)."""
        self.connection = connection
        """The transport the calls go over (the registry page names its broker and topicspace from it)."""
        self._sign = sign
        self.workspace = workspace
        self.timeout = timeout
        self.page_limit = PAGE_LIMIT
        self._queues: RequestClient | None = None
        """The config queues, unless `requests` goes another way."""
        if requests is None:
            requests = self._queues = RequestClient(
                connection,
                connection.topics.config_request,
                connection.topics.config_response,
                name="config-client",
                bulk=True,
            )
        self._rpc: Requests = requests
        self._resend = self._queues is not None and connection.capabilities.resend_on_silence

    async def start(self) -> "ConfigClient":
        await self._rpc.start()
        return self

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, request: ConfigRequest, timeout: float | None = None) -> ConfigResponse:
        if self._sign is not None and request.operation in ("put", "delete"):
            request = self._sign(request)  # once: a resend carries the same signature, which the store recognises
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
        Every attempt carries the same request id: a replicated store that made
        a write answers its resend as made (`Journal.made`), never makes it twice.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        attempt = FIRST_ATTEMPT if self._resend else timeout
        request_id = self._queues.new_id() if self._queues is not None else None
        while True:
            remaining = deadline - loop.time()
            try:
                if self._queues is not None:
                    return await self._queues.request(request, timeout=min(attempt, remaining), request_id=request_id)
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
        """Keys of a type, in key order, read page by page at one version."""
        _, pages = await self._read("list", [item_type], workspace)
        return [key for key, _ in pages[item_type]]

    async def getvalues(self, item_type: str, *, workspace: str | None = None) -> dict[str, str]:
        """Items of a type, read page by page at one version."""
        return (await self.read_types([item_type], workspace=workspace))[1][item_type]

    async def read_types(
        self, item_types: Iterable[str], *, workspace: str | None = None, timeout: float | None = None
    ) -> tuple[int, dict[str, dict[str, str]]]:
        """The items of each type and the one version they were all read at: what a reader of `tool` + `tool-service`
        needs.

        Each type is read in pages (no answer has to fit the whole store in
        one message); if a write lands between pages, the read starts over,
        up to `READ_ATTEMPTS` times, all within `timeout`.
        """
        version, pages = await self._read("getvalues", list(item_types), workspace, timeout)
        return version, {t: {k: v for k, v in rows if v is not None} for t, rows in pages.items()}

    async def _read(
        self, operation: str, item_types: Types, workspace: str | None, timeout: float | None = None
    ) -> tuple[int, dict[str, Rows]]:
        total = timeout or self.timeout
        deadline = asyncio.get_running_loop().time() + total
        for _ in range(READ_ATTEMPTS):
            read = await self._read_once(operation, item_types, workspace or self.workspace, deadline, total)
            if read is not None:
                return read
            log.debug(
                "config.read_restarted", operation=operation, types=item_types, reason="version moved between pages"
            )
        raise ConfigError(
            f"the config store changed on every one of {READ_ATTEMPTS} attempts to read {', '.join(item_types)}; retry"
            " when writes calm down",
            "busy",
        )

    async def _read_once(
        self, operation: str, item_types: Types, workspace: str, deadline: float, total: float
    ) -> tuple[int, dict[str, Rows]] | None:
        """Every page of every type at one version; None if the version moved between pages.

        The types are read side by side: a `ToolSet`'s reload reads two, and
        waiting for one before asking for the other cost a round trip on
        every reload (`python -m bench --only stages`).
        """
        reads = await asyncio.gather(*(self._read_type(operation, t, workspace, deadline, total) for t in item_types))
        if any(read is None for read in reads) or len({read[0] for read in reads if read is not None}) > 1:
            return None
        pages = {t: read[1] for t, read in zip(item_types, reads) if read is not None}
        return (reads[0][0] if reads and reads[0] is not None else None) or 0, pages

    async def _read_type(
        self, operation: str, item_type: str, workspace: str, deadline: float, total: float
    ) -> tuple[int | None, Rows] | None:
        """Every page of one type and the version they were all read at; None if it moved between pages."""
        loop = asyncio.get_running_loop()
        version: int | None = None
        rows: Rows = []
        after: str | None = None
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise RequestTimeout(
                    f"the config store did not answer within {total:g}s; is it running (`toolreg up`)?"
                )
            request = _config_request(
                operation=operation, workspace=workspace, type=item_type, limit=self.page_limit, after=after
            )
            response = await self._call(request, remaining)
            if version is None:
                version = response.version
            elif response.version != version:
                return None
            page: Rows = (
                [(k, None) for k in response.directory]
                if operation == "list"
                else [(v.key, v.value) for v in response.values]
            )
            rows.extend(page)
            if not response.more:  # a store that does not page answers everything at once, without `more`
                return version, rows
            if not page:
                raise ConfigError(
                    "the config store said more items follow but sent none; it may be damaged", "bad-response"
                )
            after = page[-1][0]

    async def changes(
        self,
        since: int,
        item_types: Iterable[str] = (),
        *,
        workspace: str | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Delta]:
        """What changed since version `since` (of `item_types`; none: every type) and the version it brings the reader
        to: each changed key's value now, None for one deleted. Read in pages at one version, as `read_types` is.

        `ChangesUnavailable` when the store cannot say (past its change feed's
        window, or a store with no feed): read everything instead.
        """
        total = timeout or self.timeout
        deadline = asyncio.get_running_loop().time() + total
        for _ in range(READ_ATTEMPTS):
            read = await self._changes_once(
                since, sorted(set(item_types)), workspace or self.workspace, deadline, total
            )
            if read is not None:
                return read
        raise ConfigError(
            f"the config store changed on every one of {READ_ATTEMPTS} attempts to read its changes; retry", "busy"
        )

    async def _changes_once(
        self, since: int, item_types: Types, workspace: str, deadline: float, total: float
    ) -> tuple[int, Delta] | None:
        """Every page of the changes since `since` at one version; None if the version moved between pages."""
        loop = asyncio.get_running_loop()
        version: int | None = None
        delta: Delta = {}
        after: str | None = None
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise RequestTimeout(
                    f"the config store did not answer within {total:g}s; is it running (`toolreg up`)?"
                )
            request = _config_request(
                operation=CHANGES_OPERATION,
                workspace=workspace,
                since=since,
                types=item_types or None,
                limit=self.page_limit,
                after=after,
            )
            try:
                response = await self._call(request, remaining)
            except ConfigError as exc:
                if exc.code == "bad-operation":  # TrustGraph's store, or one older than the change feed
                    raise ChangesUnavailable(f"the config store has no change feed: {exc}", exc.code) from None
                raise
            if version is None:
                version = response.version
            elif response.version != version:
                return None
            for item in response.values:
                delta.setdefault(item.type, {})[item.key] = item.value
            if not response.more:
                return version, delta
            if not response.values:
                raise ConfigError(
                    "the config store said more changes follow but sent none; it may be damaged", "bad-response"
                )
            after = f"{response.values[-1].type}/{response.values[-1].key}"

    async def version(self, *, workspace: str | None = None, timeout: float | None = None) -> int:
        """The store's current version, cheaply (an empty `get`): for periodic change checks."""
        request = _config_request(operation="get", workspace=workspace or self.workspace)
        return (await self._call(request, timeout)).version or 0

    async def config(
        self, *, workspace: str | None = None, timeout: float | None = None
    ) -> tuple[int, dict[str, dict[str, str]]]:
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
        await handler(push.with_keys(message.properties) if message.properties else push)

    return await connection.subscribe(connection.topics.config_notify, on_push)

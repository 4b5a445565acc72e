"""The config store service: `ConfigStore` answering on the config queues.

Each request is handled to completion without yielding between its SQLite
read and write, so requests are atomic even though several run at once.
A push goes out on the notify topic *before* the reply, so a writer that has
its answer knows every watcher has been told.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from toolservice_base.errors import TransportError
from toolservice_base.logs import get_logger
from toolservice_base.rpc import RequestServer
from toolservice_base.schemas import (
    MAX_CONFIG_REQUEST_BYTES,
    ConfigPush,
    ConfigRequest,
    ConfigResponse,
    ConfigValue,
    Error,
    describe_validation_error,
)
from toolservice_base.transport import Envelope, Publisher, Transport

from .health import ConfigStoreMetrics
from .store import Changes, ConfigStore, Conflict, StoreError

log = get_logger("discovery.config")

STORE_FILE = "config.sqlite"


class ConfigStoreService:
    """Serve a `ConfigStore` over Pulsar."""

    def __init__(self, connection: Transport, store: ConfigStore, *, metrics: ConfigStoreMetrics | None = None) -> None:
        self._connection = connection
        self.store = store
        self.metrics = metrics or ConfigStoreMetrics.default()
        self._server = RequestServer(
            connection,
            connection.topics.config_request,
            connection.topics.config_response,
            self._handle,
            subscription="config-store",
        )
        self._notify: Publisher | None = None
        self._stopped = False

    @classmethod
    def in_data_dir(cls, connection: Transport, data_dir: str | Path) -> "ConfigStoreService":
        return cls(connection, ConfigStore(Path(data_dir) / STORE_FILE))

    async def start(self) -> None:
        notify = await self._connection.publisher(self._connection.topics.config_notify)
        try:
            await self._server.start()
        except BaseException:
            await self._connection.close_publisher(notify)
            raise
        self._notify = notify
        self.metrics.set_version(self.store.version)
        log.info("config.store_started", path=str(self.store.path), version=self.store.version)

    def readiness(self) -> str | None:
        """None while the store answers requests and pushes changes; else why not. For `/readyz`."""
        if self._stopped:
            return "stopped"
        if self._notify is None:
            return "not started"
        if not (self._notify.connected and self._server.connected):
            return f"not connected to the broker at {self._connection.url}"
        try:
            _ = self.store.version  # one read proves the SQLite file answers
        except sqlite3.Error as exc:
            return f"store {self.store.path} unreadable: {exc}"
        return None

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self._server.stop()
        if self._notify is not None:
            await self._connection.close_publisher(self._notify)
            self._notify = None
        self.store.close()
        log.info("config.store_stopped")

    async def _handle(self, message: Envelope, reply: Any) -> None:
        data = message.data
        try:
            if len(data) > MAX_CONFIG_REQUEST_BYTES:
                raise ValueError(f"request is {len(data)} bytes; the limit is {MAX_CONFIG_REQUEST_BYTES}")
            request = ConfigRequest.model_validate_json(data)
        except (ValidationError, ValueError) as exc:
            reason = describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
            log.warning("config.request_rejected", reason=reason)
            self.metrics.request("invalid", "bad-request")
            await reply(ConfigResponse(error=Error(type="bad-request", message=f"bad config request: {reason}")))
            return
        started = time.perf_counter()
        try:
            response, changes = self._execute(request)
        except Conflict as exc:
            response, changes = ConfigResponse(version=self.store.version, error=Error(type="conflict", message=str(exc))), {}
        except StoreError as exc:
            log.info("config.write_refused", operation=request.operation, reason=str(exc))
            response, changes = ConfigResponse(version=self.store.version, error=Error(type="invalid", message=str(exc))), {}
        self.metrics.request(request.operation, response.error.type if response.error else None)
        if changes:
            self.metrics.set_version(response.version or 0)
            await self._push(ConfigPush(version=response.version or 0, changes=changes))
            log.info(
                "config.changed",
                operation=request.operation,
                workspace=request.workspace,
                version=response.version,
                types=sorted(changes),
                ms=round((time.perf_counter() - started) * 1000, 2),
            )
        await reply(response)

    def _execute(self, request: ConfigRequest) -> tuple[ConfigResponse, Changes]:
        store, ws = self.store, request.workspace
        op = request.operation
        if op == "get":
            found = store.get(ws, [(k.type, k.key) for k in request.keys])
            values = [ConfigValue(type=t, key=k, value=v) for t, k, v in found]
            return ConfigResponse(version=store.version, values=values), {}
        if op == "put":
            version, changes = store.apply(
                ws,
                puts=[(v.type, v.key, v.value) for v in request.values],
                deletes=[(k.type, k.key) for k in request.keys],
                expect=[(e.type, e.key, e.value) for e in request.expect],
            )
            return ConfigResponse(version=version), changes
        if op == "delete":
            version, changes = store.apply(
                ws, deletes=[(k.type, k.key) for k in request.keys], expect=[(e.type, e.key, e.value) for e in request.expect]
            )
            return ConfigResponse(version=version), changes
        if op in ("list", "getvalues"):
            if not request.type:
                raise StoreError(f"operation '{op}' needs 'type'")
            if op == "list":
                return ConfigResponse(version=store.version, directory=store.list(ws, request.type)), {}
            pairs = store.getvalues(ws, request.type)
            return ConfigResponse(version=store.version, values=[ConfigValue(type=request.type, key=k, value=v) for k, v in pairs]), {}
        version, config = store.config(ws)
        return ConfigResponse(version=version, config=config), {}

    async def _push(self, push: ConfigPush) -> None:
        if self._notify is None:
            return
        try:
            await self._notify.send(push)
        except TransportError as exc:
            log.warning("config.push_failed", version=push.version, error=str(exc))

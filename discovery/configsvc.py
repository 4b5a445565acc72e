"""The config store service: `ConfigStore` answering on the config queues.

Each request is handled to completion without yielding between its SQLite
read and write, so requests are atomic even though several run at once.
A push goes out on the notify topic *before* the reply, so a writer that has
its answer knows every watcher has been told.

Every request gets an answer. One the SQLite file cannot serve is answered
`store-error`; a file SQLite calls corrupt marks the store damaged, and from
then on every request is answered `store-error` with how to recover, never
half-served. Meanwhile a background task keeps the store's marker current and
takes the automatic backups (`store_backup`).
"""

from __future__ import annotations

import asyncio
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

from . import store_backup
from .health import ConfigStoreMetrics
from .store import Changes, ConfigStore, Conflict, StoreError
from .store_check import StoreDamaged, how_to_recover, is_corruption

log = get_logger("discovery.config")

STORE_FILE = "config.sqlite"


class ConfigStoreService:
    """Serve a `ConfigStore` over Pulsar."""

    def __init__(
        self,
        connection: Transport,
        store: ConfigStore,
        *,
        metrics: ConfigStoreMetrics | None = None,
        backup_interval: float = store_backup.INTERVAL,
        backup_versions: int = store_backup.MAX_VERSIONS,
        backup_keep: int = store_backup.KEEP,
        mark_interval: float = 1.0,
    ) -> None:
        """Backups: at start, then once the store changed and `backup_interval` seconds or `backup_versions` versions passed."""
        self._connection = connection
        self.store = store
        self.metrics = metrics or ConfigStoreMetrics.default()
        self.backup_interval = backup_interval
        self.backup_versions = backup_versions
        self.backup_keep = backup_keep
        self.mark_interval = mark_interval
        self.damaged: str | None = None
        """Why the store is no longer served (SQLite found it corrupt), with how to recover; None while it is whole."""
        self.last_backup: store_backup.Backup | None = None
        self._maintenance: asyncio.Task[None] | None = None
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
        self._maintenance = asyncio.create_task(self._maintain(), name="config-store-maintenance")
        log.info("config.store_started", path=str(self.store.path), version=self.store.version)

    def readiness(self) -> str | None:
        """None while the store answers requests and pushes changes; else why not. For `/readyz`."""
        if self._stopped:
            return "stopped"
        if self._notify is None:
            return "not started"
        if self.damaged is not None:
            return self.damaged
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
        if self._maintenance is not None:
            self._maintenance.cancel()
            try:
                await self._maintenance
            except (asyncio.CancelledError, Exception):
                pass
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
            if self.damaged is not None:
                raise StoreDamaged(self.damaged)
            response, changes = self._execute(request)
        except Conflict as exc:
            response, changes = ConfigResponse(version=self._version(), error=Error(type="conflict", message=str(exc))), {}
        except StoreError as exc:
            log.info("config.write_refused", operation=request.operation, reason=str(exc))
            response, changes = ConfigResponse(version=self._version(), error=Error(type="invalid", message=str(exc))), {}
        except StoreDamaged as exc:
            response, changes = ConfigResponse(error=Error(type="store-error", message=str(exc))), {}
        except sqlite3.Error as exc:
            response, changes = ConfigResponse(error=Error(type="store-error", message=self._store_failed(request.operation, exc))), {}
        except Exception as exc:  # a bug: still an answer, so the caller is not left waiting for its timeout
            log.exception("config.request_failed", operation=request.operation)
            response, changes = ConfigResponse(error=Error(type="internal-error", message=f"the config store failed: {type(exc).__name__}: {exc}")), {}
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

    def _version(self) -> int | None:
        try:
            return self.store.version
        except sqlite3.Error:
            return None

    def _store_failed(self, operation: str, exc: sqlite3.Error) -> str:
        """Log a failed SQLite call and say it in one line; corruption marks the store damaged for good."""
        path = self.store.path
        if is_corruption(exc):
            if self.damaged is None:
                recover = how_to_recover(path, running=True)
                self.damaged = f"config store {path} is damaged ({exc}); it answers nothing until restored: {recover}"
                log.error("config.store_damaged", path=str(path), operation=operation, error=str(exc), recover=recover)
            return self.damaged
        log.error("config.store_failed", path=str(path), operation=operation, error=str(exc))
        return f"the config store could not {operation}: {exc} ({path}); see the `toolreg up` log"

    async def _maintain(self) -> None:
        """Keep the marker current (every `mark_interval`) and take backups when they are due."""
        path = self.store.path
        newest = store_backup.backups_of(path)
        backed_up = store_backup.version_of_backup(newest[-1]) if newest else None
        backed_up_at = time.monotonic() if backed_up is not None else float("-inf")
        while True:
            try:
                if self.damaged is None:
                    self.store.mark()
                    version = self.store.version
                    if version > 0 and version != backed_up and (
                        time.monotonic() - backed_up_at >= self.backup_interval
                        or backed_up is None
                        or abs(version - backed_up) >= self.backup_versions
                    ):
                        backed_up_at = time.monotonic()
                        backed_up = await self._backup()
            except sqlite3.Error as exc:
                self._store_failed("keep its marker", exc)
            except (OSError, StoreDamaged) as exc:
                log.error("config.backup_failed", path=str(path), error=str(exc))
            await asyncio.sleep(self.mark_interval)

    async def _backup(self) -> int:
        backup = await asyncio.to_thread(store_backup.take_backup, self.store.path)
        pruned = store_backup.prune(self.store.path, self.backup_keep)
        self.last_backup = backup
        log.info(
            "config.backup_taken",
            path=str(backup.path),
            version=backup.facts.version,
            items=backup.facts.items,
            ms=round(backup.seconds * 1000, 1),
            pruned=len(pruned),
        )
        return backup.facts.version

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

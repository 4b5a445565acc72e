"""The config store service: `ConfigStore` answering on the config queues.

It answers where TrustGraph's config service does: the system queue
(`request/config`, the workspace in the request body) and, like TrustGraph's,
one queue per workspace (`request/config:<workspace>`, the workspace taken
from the queue), which TrustGraph's API gateway uses (`workspace_queues`). What
each request does is `operations`; this module is the transport around it.

Each request is handled to completion without yielding between its SQLite
read and write, so requests are atomic even though several run at once.
A push goes out on the notify topic *before* the reply, so a writer that has
its answer knows every watcher has been told. On start the store pushes once
with empty `changes`, TrustGraph's "everything may have changed" poke.

Every request gets an answer: `store-error` for one the SQLite file cannot
serve (corrupt: then every one, with how to recover); a write the file system
refuses (read-only, permissions, full disk) is answered with the cause and the
fix, `/readyz` says so until it can write again, and nothing written is lost.
A background task keeps the store's marker current, watches that the store can
still write, and takes the automatic backups (`upkeep`, over `backup`).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any, Self

from pydantic import ValidationError

from toolservice_base.errors import TransportError
from toolservice_base.logs import get_logger
from toolservice_base.rpc import RequestServer
from toolservice_base.rpc.wire import ID
from toolservice_base.schemas import (
    CONFIG_OPERATIONS,
    MAX_CONFIG_REQUEST_BYTES,
    ConfigPush,
    ConfigRequest,
    ConfigResponse,
    ErrorBody,
    describe_validation_error,
)
from toolservice_base.tasks import cancel_and_wait
from toolservice_base.transport import Envelope, Publisher, Transport

from . import backup as store_backup
from .check import StoreDamaged, access_problem, how_to_recover, is_corruption
from .journal import Journal, already_made, made_durable, not_active
from .metrics import ConfigStoreMetrics
from .operations import ConfigOperations, Outcome, StoreProtocol
from .sqlite import STORE_FILE, ConfigStore
from .upkeep import Upkeep
from .workspace_queues import WorkspaceQueues
from .writability import Writability
from .write_policy import REFUSAL, ConfigWriteGuard

log = get_logger("discovery.store")

SUBSCRIPTION = "config-store"


def answer_too_large(reason: str) -> dict[str, Any]:
    """The store's answer when its answer is over the broker's limit: an error a TrustGraph reader understands, not
    silence."""
    message = f"{reason}; read by type in pages (`getvalues` or `list` with `limit` and `after`)"
    return ConfigResponse(error=ErrorBody(type="answer-too-large", message=message)).to_trustgraph()


class ConfigStoreService:
    """Serve a `ConfigStore` over Pulsar, in our protocol (default) or exactly as TrustGraph's store."""

    def __init__(
        self,
        connection: Transport,
        store: ConfigStore,
        *,
        metrics: ConfigStoreMetrics | None = None,
        protocol: StoreProtocol = "toolreg",
        backup_interval: float = store_backup.INTERVAL,
        backup_versions: int = store_backup.MAX_VERSIONS,
        backup_keep: int = store_backup.KEEP,
        mark_interval: float = 1.0,
        journal: Journal | None = None,
        close_store: bool = True,
        write_guard: ConfigWriteGuard | None = None,
    ) -> None:
        """Backups: at start, then once the store changed and `backup_interval` seconds or `backup_versions` versions
        passed.

        With a `journal` (the replicated store), every write is appended to it
        before it is answered or pushed, and requests are served one at a time
        around that append, so no reader ever sees a write that is not durable.
        The store then has no file: no markers, no backups.
        """
        self._connection = connection
        self.store = store
        self.journal = journal
        self.write_guard = write_guard
        self._close_store = close_store
        self._serial = asyncio.Lock()
        self.operations = ConfigOperations(store, protocol)
        self.metrics = metrics or ConfigStoreMetrics.default()
        self.damaged: str | None = None
        """Why the store is no longer served (SQLite found it corrupt), with how to recover; None while it is whole."""
        self.writability = Writability(store.path)
        """Whether the file system takes the store's writes (read-only mount, permissions, full disk): not damage, reads
        are still served, and it clears by itself once a write can succeed."""
        self.upkeep = Upkeep(
            store,
            self.writability,
            damaged=lambda: self.damaged,
            store_failed=self._store_failed,
            mark_interval=mark_interval,
            backup_interval=backup_interval,
            backup_versions=backup_versions,
            backup_keep=backup_keep,
        )
        """Marker, writability and backups, for a store with a file (`upkeep`)."""
        self._maintenance: asyncio.Task[None] | None = None
        self._server = RequestServer(
            connection,
            connection.topics.config_request,
            connection.topics.config_response,
            self._on_system,
            subscription=SUBSCRIPTION,
            too_large=answer_too_large,
        )
        self.queues = WorkspaceQueues(connection, self._handle, subscription=SUBSCRIPTION, too_large=answer_too_large)
        """The workspaces answered on their own queue (`workspace_queues`)."""
        self._notify: Publisher | None = None
        self._stopped = False

    @property
    def protocol(self) -> StoreProtocol:
        return self.operations.protocol

    @classmethod
    def in_data_dir(
        cls, connection: Transport, data_dir: str | Path, *, protocol: StoreProtocol = "toolreg"
    ) -> "ConfigStoreService":
        return cls(connection, ConfigStore(Path(data_dir) / STORE_FILE), protocol=protocol)

    async def start(self) -> None:
        """A failure half-way closes what was opened (`stop()` is safe at any point)."""
        try:
            self._notify = await self._connection.publisher(self._connection.topics.config_notify)
            await self._push(ConfigPush(version=self.store.version))
            await self._server.start()
            await self.queues.start(self.operations.queue_workspaces())
        except BaseException:
            await self._close_all()
            raise
        self.metrics.set_version(self.store.version)
        if self.store.durable:
            self._maintenance = asyncio.create_task(self.upkeep.run(), name="config-store-maintenance")
        log.info(
            "config.store_started",
            path=str(self.store.path),
            version=self.store.version,
            protocol=self.protocol,
            workspace_queues=self.queues.workspaces,
        )

    def readiness(self) -> str | None:
        """None while the store answers requests and pushes changes; else why not. For `/readyz`."""
        if self._stopped:
            return "stopped"
        if self._notify is None:
            return "not started"
        if self.damaged is not None:
            return self.damaged
        if self.writability.reason is not None:
            return self.writability.reason
        if not (self._notify.connected and self._server.connected):
            return f"not connected to the broker at {self._connection.url}"
        try:
            _ = self.store.version  # one read proves the SQLite file answers
        except sqlite3.Error as exc:
            return f"store {self.store.path} unreadable: {exc}"
        return None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop serving, close the queues and (unless told otherwise) the store. Safe twice, and after a failed
        start."""
        if self._stopped:
            return
        self._stopped = True
        await cancel_and_wait(self._maintenance)
        await self._close_all()
        if self._close_store:
            self.store.close()
        log.info("config.store_stopped")

    async def _close_all(self) -> None:
        await self.queues.close()
        await self._server.stop()
        if self._notify is not None:
            await self._connection.close_publisher(self._notify)
            self._notify = None

    @property
    def workspace_queues(self) -> list[str]:
        """Workspaces answered on their own queue now."""
        return self.queues.workspaces

    # --- requests ------------------------------------------------------------

    async def _on_system(self, message: Envelope, reply: Any) -> None:
        await self._handle(message, reply, None)

    async def _handle(self, message: Envelope, reply: Any, queue_workspace: str | None) -> None:
        data = message.data
        try:
            if len(data) > MAX_CONFIG_REQUEST_BYTES:
                raise ValueError(f"request is {len(data)} bytes; the limit is {MAX_CONFIG_REQUEST_BYTES}")
            request = ConfigRequest.model_validate_json(data)
        except (ValidationError, ValueError) as exc:
            reason = describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
            log.warning("config.request_rejected", reason=reason)
            self.metrics.request("invalid", "bad-request")
            await reply(
                ConfigResponse(
                    error=ErrorBody(type="bad-request", message=f"bad config request: {reason}")
                ).to_trustgraph()
            )
            return
        response = await self.answer(request, queue_workspace, request_id=message.properties.get(ID) or None)
        await reply(response.to_trustgraph())

    async def answer(
        self,
        request: ConfigRequest,
        queue_workspace: str | None = None,
        *,
        local: bool = False,
        request_id: str | None = None,
    ) -> ConfigResponse:
        """Serve one request as the queues do (atomic, durable, pushed before it returns); for a client in this process
        (`LocalRequests`, `local`: never waiting on the broker's subscription, nor signed: `write_guard`), too.
        `request_id`: the id its sender gave it, by which a write the journal already holds is answered, not made
        again (`Journal.made`)."""
        guard = None if local else self.write_guard
        if guard is None or not guard.covers(request, queue_workspace):
            return await self._answer(request, queue_workspace, request_id)
        response = await guard.serve(
            request,
            lambda logged_as: self._answer(request, queue_workspace, logged_as),
            queue_workspace=queue_workspace,
            request_id=request_id,
            journal=self.journal,
        )
        if response.error is not None and response.error.type == REFUSAL:
            self.metrics.request(request.operation, REFUSAL)
        return response

    async def _answer(
        self, request: ConfigRequest, queue_workspace: str | None, request_id: str | None
    ) -> ConfigResponse:
        started = time.perf_counter()
        async with self._serial:
            refused = await self.journal.confirm() if self.journal is not None else None
            if refused is not None:
                outcome = not_active(refused)
            else:
                made = already_made(self.journal, request, request_id, self.operations.trustgraph)
                outcome = made or self._execute(request, queue_workspace)
            if self.journal is not None and self.journal.must_log(outcome.write):
                outcome = await self._make_durable(outcome, request.operation, request_id)
        if outcome.write is not None:
            self.writability.wrote("a write succeeded")
            self.metrics.set_version(outcome.write.version)
        response = outcome.response
        if response.error is not None and response.error.type not in ("conflict", "bad-operation"):
            log.info(
                "config.write_refused" if request.operation in ("put", "delete") else "config.request_refused",
                operation=request.operation,
                reason=response.error.message,
            )
        self.metrics.request(
            request.operation if request.operation in CONFIG_OPERATIONS else "invalid",
            response.error.type if response.error else None,
        )
        if outcome.push is not None:
            await self._push(outcome.push)
            log.info(
                "config.changed",
                operation=request.operation,
                workspace=queue_workspace or request.workspace,
                version=outcome.push.version,
                types=sorted(outcome.push.changes),
                ms=round((time.perf_counter() - started) * 1000, 2),
            )
        for workspace in outcome.opened:
            self.queues.came(workspace)
        for workspace in outcome.closed:
            self.queues.went(workspace)
        return response

    async def _make_durable(self, outcome: Outcome, operation: str, request_id: str | None = None) -> Outcome:
        """Append the write to the journal; answer it only once that returned (`made_durable`)."""
        assert self.journal is not None
        if outcome.write is None:
            return outcome
        outcome, lost = await made_durable(self.journal, outcome.write, outcome, operation, request_id)
        if lost is not None:
            self.damaged = lost
        return outcome

    def _store_failed(self, operation: str, exc: sqlite3.Error) -> str:
        """Log a failed SQLite call and say it in one line; corruption marks the store damaged for good.

        A refusal of the file system (read-only, full disk) is told apart from
        damage: it is said with its cause and fix, and lasts only as long as it.
        """
        path = self.store.path
        if is_corruption(exc):
            if self.damaged is None:
                recover = how_to_recover(path, running=True)
                self.damaged = f"config store {path} is damaged ({exc}); it answers nothing until restored: {recover}"
                log.error("config.store_damaged", path=str(path), operation=operation, error=str(exc), recover=recover)
            return self.damaged
        problem = access_problem(exc, path) if self.store.durable else None
        if problem is not None:
            return self.writability.refused(problem, operation, str(exc))
        log.error("config.store_failed", path=str(path), operation=operation, error=str(exc))
        return f"the config store could not {operation}: {exc} ({path}); see the `toolreg up` log"

    def _execute(self, request: ConfigRequest, queue_workspace: str | None) -> Outcome:
        """Every request gets an answer: a damaged store or a failing SQLite call is `store-error`, a bug
        `internal-error`."""
        try:
            if self.damaged is not None:
                raise StoreDamaged(self.damaged)
            return self.operations.execute(request, queue_workspace)
        except StoreDamaged as exc:
            return Outcome(ConfigResponse(error=ErrorBody(type="store-error", message=str(exc))))
        except sqlite3.Error as exc:
            return Outcome(
                ConfigResponse(error=ErrorBody(type="store-error", message=self._store_failed(request.operation, exc)))
            )
        except Exception as exc:  # a bug: still an answer, so the caller is not left waiting for its timeout
            log.exception("config.request_failed", operation=request.operation)
            message = f"the config store failed: {type(exc).__name__}: {exc}"
            return Outcome(ConfigResponse(error=ErrorBody(type="internal-error", message=message)))

    async def _push(self, push: ConfigPush) -> None:
        if self._notify is None:
            return
        try:
            await self._notify.send(push.to_trustgraph(), push.properties())
        except TransportError as exc:
            log.warning("config.push_failed", version=push.version, error=str(exc))

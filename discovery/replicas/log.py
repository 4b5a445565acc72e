"""A replicated append-only log of JSON entries on a persistent topic, with snapshots for a bounded start.

Every replica keeps the same state by applying the same entries in the same
order; the broker keeps the order. The state is opaque here: a
`StateMachine` (the config store's tables, later) applies an entry, lists
its whole content for a snapshot, and takes one back.

- **Entries** (`Topics.state_log`) are JSON: `format` (an int: a reader that
  meets a newer one stops, in one line, rather than apply it wrongly),
  `version` (strictly increasing, may skip), `previous` (the version the
  writer's state was at: the entry it follows), `term` (of the writer, for
  diagnosis) and `payload`. A reader applies an entry only if its version is
  above the state's, so duplicates and anything stale are ignored and the
  version never goes back. `previous` came later within format 1: older
  readers ignore it, and entries without it are taken as they come.
- **Writing**: only the active replica of an `Election`, through its
  `fence`-mode writer, one entry at a time; `append` returns once the entry
  is persisted, and applies it locally. On promotion the new active first
  opens its writer (fencing the deposed one's), then reads to the end (until
  `has_message_available` is false), then writes: so it has seen every entry
  the deposed one persisted, and nothing can follow them but its own.
- **Snapshots** (`Topics.state_snapshot`): every `snapshot_every` entries or
  `snapshot_bytes` bytes, the active writes the whole state as chunks of
  about `chunk_bytes` (well under the 5 MiB message limit), then a manifest
  naming the snapshot's version, the log position it covers and its first
  chunk. A starting replica reads the last manifest (a reader at the latest
  message, inclusive; if the last message is a chunk of a snapshot cut
  short, the chunk names the manifest before it), the chunks, and then the
  log from the manifest's position: start-up reads the recent entries only.
  A damaged snapshot (a chunk missing, a digest mismatch) is skipped for a
  full replay, which the unlimited retention of the `state` namespace allows.
- **Wholeness** (`wholeness`): on a namespace without retention the broker
  deletes the log's history, and a reader placed in it silently starts at
  what is left. Every reader checks what it meets (each entry's `previous`,
  the snapshot's own entry) and stops with `LogIncomplete` where writes
  are, or may be, gone, so no replica serves a state without them; history
  deleted with nothing lost yet is said once (`history_deleted`).
- **Tailing**: a standby applies entries as they come (`poll` seconds at most
  between looks), so it is ready to take over at once.
- **Only what it can trust** (`records`): an entry that does not check under
  the group key, or is malformed or out of range, is refused (logged once per
  producer) and skipped, never a crash; the active confirms its lock before it
  acknowledges an append (`Election.confirm`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Protocol, Self

__all__ = [
    "CHUNK_BYTES",
    "FORMAT",
    "ITEM_LIMIT",
    "SNAPSHOT_FORMAT",
    "LogEntry",
    "Manifest",
    "ReplicatedLog",
    "StateMachine",
]

from discovery.errors import NewerFormat, NotActive, ReplicationError
from toolservice_base.errors import TransportClosed, TransportError
from toolservice_base.logs import get_logger
from toolservice_base.tasks import cancel_and_wait
from toolservice_base.transport import Envelope, Reader, Transport

from .core import Apply, Finding, Ignore, NotHolding, ReplicaCore, Seen, Stop, WriteSnapshot
from .election import ElectedWriter, Election
from .groupkey import GroupKey
from .records import Malformed, RecordCheck, counter, sign
from .snapshots import (
    CHUNK_BYTES,
    ITEM_LIMIT,
    READ_TIMEOUT,
    SNAPSHOT_FORMAT,
    Manifest,
    items_of,
    last_manifest,
    pack,
    read_chunks,
    send_snapshot,
)

log = get_logger("discovery.replicas.log")

FORMAT = 1
"""The entry format this version writes and the newest it reads."""
ENTRY_KIND = "entry"
"""What an entry's MAC says it is (`groupkey`)."""


@dataclass(frozen=True)
class LogEntry:
    """One applied (or appended) entry."""

    version: int
    payload: Any
    term: int = 0
    format: int = FORMAT
    message_id: bytes = b""
    """Where it sits in the log topic."""
    previous: int | None = None
    """The version its writer's state was at (the entry it follows); None in entries of writers before it was added."""
    seen: Seen = Seen("unchecked")
    """Its authentication under the group key, as read (`core.keys`)."""


class StateMachine(Protocol):
    """The replicated state, as the log sees it. Called from the event loop, one call at a time."""

    def apply(self, entry: LogEntry) -> None:
        """Apply one entry (its version is above every one applied before)."""

    def snapshot(self) -> Iterable[Any]:
        """The whole state as JSON values, as of the last entry applied; iterated without a pause (so nothing changes
        meanwhile)."""

    def restore(self, version: int, items: Iterable[Any]) -> None:
        """Replace the whole state with a snapshot's items, as of `version`."""


class ReplicatedLog:
    """The log, the state it keeps up to date, and (with an `Election`) the writing side.

    `async with ReplicatedLog(...)` restores the last snapshot, reads the log
    to its end and keeps tailing it; enter it before its election, whose
    promotions and demotions it follows (writable only while active, and
    caught up). Without an election it is a read-only follower.
    """

    def __init__(
        self,
        transport: Transport,
        state: StateMachine,
        *,
        election: Election | None = None,
        log_topic: str | None = None,
        snapshot_topic: str | None = None,
        snapshot_every: int = 10_000,
        snapshot_bytes: int = 64 * 1024 * 1024,
        chunk_bytes: int = CHUNK_BYTES,
        use_snapshots: bool = True,
        require_whole: bool = True,
        poll: float = 0.1,
        key: GroupKey | None = None,
    ) -> None:
        """`require_whole=False` reads a log that lost entries anyway (each gap logged): only for a writer about to
        replace the whole state (`toolreg store import --force`), never for a replica that serves it. `key`: the
        group key records are signed and checked with (None: the broker's permissions alone)."""
        if not 0 < chunk_bytes <= ITEM_LIMIT:
            raise ValueError(f"chunk_bytes must be in (0, {ITEM_LIMIT}], got {chunk_bytes}")
        self._transport = transport
        self._state = state
        self._election = election
        self.log_topic = log_topic or transport.topics.state_log
        self.snapshot_topic = snapshot_topic or transport.topics.state_snapshot
        self.snapshot_every = snapshot_every
        self.snapshot_bytes = snapshot_bytes
        self._chunk_bytes = chunk_bytes
        self._use_snapshots = use_snapshots
        self._require_whole = require_whole
        self._poll = poll
        self._core = election.core if election is not None else ReplicaCore("reader", key=key)
        """The rules entries are applied, appended and snapshotted by (the election's, when it writes)."""
        self._core.follow_log(self.log_topic, require_whole=require_whole)
        self.position = b""
        """The log message id of that entry: where a reader goes on from."""
        self.term = 0
        self.manifest: Manifest | None = None
        """The last complete snapshot known (restored, or written by this replica)."""
        self.history_deleted: str | None = None
        """Set (the line logged) when the broker deleted entries the last snapshot covers: nothing lost yet, retention
        missing."""
        self.stats = {"applied": 0, "ignored": 0, "refused": 0, "appended": 0, "snapshots": 0, "restored_items": 0}
        """Counters: entries applied (read or appended); ignored (at or below the state's version: duplicates,
        stale ones, and on the active its own, read back); refused (malformed, out of range, unsigned or forged:
        skipped and logged); appended here; snapshots written here; items restored."""
        self._entries_total = 0
        self._bytes_total = 0
        self._snapshot_mark = (0, 0)
        self._reader: Reader | None = None
        self._reading = asyncio.Lock()
        self._appending = asyncio.Lock()
        self._snapshotting = asyncio.Lock()
        self._writer: ElectedWriter | None = None
        self._snapshot_writer: ElectedWriter | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._failure: ReplicationError | None = None
        self._key = key
        self._entries = RecordCheck(self.log_topic, key, self._core.saw)
        self._snapshots = RecordCheck(self.snapshot_topic, key, self._core.saw)
        self._stack = AsyncExitStack()

    @property
    def version(self) -> int:
        """The version of the last entry applied (or of the snapshot restored)."""
        return self._core.version

    # --- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._transport.capabilities.require_replicated_state(
            f"the replicated log on {self.log_topic}", self._transport.url
        )
        async with AsyncExitStack() as stack:
            started = time.monotonic()
            if self._use_snapshots:
                await self._restore()
            restored = time.monotonic()
            # From the snapshot's own entry, inclusive: whether the broker still holds it tells whether it deletes
            # history (`ReplicaCore.restored`).
            self._snapshot_position = self.position
            self._reader = await self._transport.reader(
                self.log_topic, self.position or "earliest", inclusive=bool(self.position)
            )
            stack.push_async_callback(self._transport.close_reader, self._reader)
            await self.catch_up()
            self._found(self._core.wholeness.at_end())
            log.info(
                "log.started",
                topic=self.log_topic,
                version=self.version,
                restored_items=self.stats["restored_items"],
                replayed=self.stats["applied"],
                restore_s=round(restored - started, 3),
                replay_s=round(time.monotonic() - restored, 3),
            )
            tail = asyncio.create_task(self._tail(), name=f"log-tail:{self.log_topic}")
            stack.push_async_callback(cancel_and_wait, tail)
            stack.push_async_callback(self._stop_writing)
            if self._election is not None:
                self._election.add_listener(self._promoted, self._demoted)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._stack.aclose()

    @property
    def writable(self) -> bool:
        """Whether `append` may be called now: active, caught up, not failed."""
        return self._writer is not None and self._failure is None

    async def wait_writable(self, timeout: float | None = None) -> None:
        """Return once `append` may be called (this replica active and caught up); TimeoutError otherwise."""
        async with asyncio.timeout(timeout):
            while not self.writable:
                self._check_failed()
                await asyncio.sleep(0.01)

    @property
    def failure(self) -> ReplicationError | None:
        """What stopped this replica from applying the log (a newer format, a damaged entry); None while it runs."""
        return self._failure

    # --- reading --------------------------------------------------------------------------

    async def catch_up(self) -> int:
        """Apply every entry the log holds now; the version reached. After taking the writer's place, that is all there
        is."""
        self._check_failed()
        assert self._reader is not None
        async with self._reading:
            while await self._reader.has_message_available():
                envelope = await self._reader.read_next(READ_TIMEOUT)
                if envelope is not None:
                    self._receive(envelope)
        return self.version

    async def _tail(self) -> None:
        assert self._reader is not None
        while self._failure is None:
            try:
                async with self._reading:
                    envelope = await self._reader.read_next(self._poll)
                    if envelope is not None:
                        self._receive(envelope)
            except ReplicationError:
                return  # recorded and logged by `_receive`
            except TransportClosed:
                return
            except TransportError as exc:
                log.warning("log.read_failed", topic=self.log_topic, error=str(exc))
                await asyncio.sleep(1.0)

    def _receive(self, envelope: Envelope) -> None:
        try:
            entry = self._parse(envelope)
            if entry is None:
                return
            self._apply(entry, envelope)
        except ReplicationError as exc:
            self._failure = exc
            log.error("log.stopped", topic=self.log_topic, version=self.version, error=str(exc))
            raise

    def _parse(self, envelope: Envelope) -> LogEntry | None:
        """The entry in a message; None (refused: logged, skipped) if it is not one, or not signed by the group key."""
        seen = self._entries.authenticate(envelope, ENTRY_KIND)
        if not seen.accepted:
            self._core.refused(seen, at_snapshot=bool(self.position) and envelope.message_id == self._snapshot_position)
            self._refuse(envelope, seen.reason)
            return None
        try:
            raw = json.loads(envelope.data)
            if not isinstance(raw, dict) or "payload" not in raw:
                raise Malformed("not a JSON object with a payload")
            entry_format = counter(raw, "format", low=1)
            version = counter(raw, "version", low=1)
            term = counter(raw, "term", default=0)
            previous = None if raw.get("previous") is None else counter(raw, "previous")
            if previous is not None and previous >= version:
                raise Malformed(f"version {version} follows version {previous}")
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            self._refuse(envelope, f"not a log entry: {exc}")
            return None
        if entry_format > FORMAT:
            raise NewerFormat(
                f"entry version {version} on {self.log_topic} was written by a newer version (format {entry_format},"
                f" this one reads up to {FORMAT}); upgrade tool-discovery on this replica"
            )
        return LogEntry(version, raw["payload"], term, entry_format, envelope.message_id, previous, seen)

    def _refuse(self, envelope: Envelope, reason: str) -> None:
        self.stats["refused"] += 1
        self._entries.refuse(envelope, ENTRY_KIND, reason)

    def _apply(self, entry: LogEntry, envelope: Envelope | None = None) -> bool:
        """Apply `entry` if the core says so (`ReplicaCore.entry`: above the state, nothing missing before it);
        whether it was.

        A state machine that raises `ValueError` says the payload is not one
        it takes (not a write of the config store, say): read from the log,
        that entry is refused and skipped like any malformed one.
        """
        decision = self._core.entry(entry.seen, entry.version, entry.previous)
        if isinstance(decision, Ignore):
            self.stats["ignored"] += 1
            return False
        if isinstance(decision, Stop):
            raise self._core.failure(decision)
        assert isinstance(decision, Apply)
        if decision.note is not None:
            self._said_deleted(decision.note)
        try:
            self._state.apply(entry)
        except ValueError as exc:
            if envelope is None:
                raise
            self._refuse(envelope, f"not an entry this state takes: {exc}")
            return False
        except Exception as exc:
            raise ReplicationError(f"applying version {entry.version} from {self.log_topic} failed: {exc}") from exc
        self._core.applied(entry.version)
        self.position, self.term = entry.message_id, max(self.term, entry.term)
        self.stats["applied"] += 1
        return True

    def _check_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    # --- wholeness: what a broker without retention deletes (`wholeness`) ------------------

    async def expect_at_least(self, version: int, seen_by: str) -> None:
        """Read the log to its end; `LogIncomplete` if it ends below `version`, which replica `seen_by` has applied."""
        self._found(self._core.wholeness.behind(await self.catch_up(), version, seen_by))

    def _found(self, finding: Finding | None) -> None:
        if finding is None:
            return
        stop = self._core.found(finding)
        if stop is not None:
            raise self._core.failure(stop)
        if not finding.lost:
            self._said_deleted(finding.line)
        else:
            log.warning("log.incomplete", topic=self.log_topic, version=self.version, note=finding.line)

    def _said_deleted(self, line: str) -> None:
        self.history_deleted = line
        log.error("log.history_deleted", topic=self.log_topic, version=self.version, note=line)

    # --- writing --------------------------------------------------------------------------

    async def _promoted(self) -> None:
        assert self._election is not None
        writer = await self._election.writer(self.log_topic)  # the deposed writer's producer is fenced from here on
        snapshot_writer = await self._election.writer(self.snapshot_topic)
        version = await self.catch_up()  # everything it persisted, before anything of ours
        self._writer, self._snapshot_writer = writer, snapshot_writer
        log.info("log.writable", topic=self.log_topic, version=version, term=self._election.term)
        if isinstance(due := self._core.on_caught_up(self._signing), WriteSnapshot):
            log.info("log.snapshot_due", topic=self.snapshot_topic, why=due.why)
            self._start_snapshot()

    async def _demoted(self, reason: str) -> None:
        await self._stop_writing()

    async def _stop_writing(self) -> None:
        self._writer = self._snapshot_writer = None
        task, self._snapshot_task = self._snapshot_task, None
        if task is not None:
            await cancel_and_wait(task)

    async def append(self, payload: Any, *, version: int | None = None) -> LogEntry:
        """Append one entry (version: the next one, unless given) and apply it; returns once it is persisted.

        Raises `NotActive` on a standby, `Fenced` if this replica has just
        been deposed (it steps down), `ValueError` for a version not above
        the state's.
        """
        self._check_failed()
        async with self._appending:
            writer = self._writer
            if writer is None:
                raise NotActive(
                    f"this replica is not the active one of {self.log_topic} (or is still catching up); write through"
                    " the active one"
                )
            decision = self._core.may_append(version)
            if isinstance(decision, NotHolding):
                raise NotActive(decision.reason)
            if self._election is not None:
                await self._election.confirm()  # no write is acknowledged by a replica that lost its lock
            next_version, previous = decision.version, self.version
            term = self._election.term if self._election else 0
            data = json.dumps(
                {"format": FORMAT, "version": next_version, "previous": previous, "term": term, "payload": payload},
                separators=(",", ":"),
            ).encode()
            properties = {"version": str(next_version), **sign(self._key, ENTRY_KIND, self.log_topic, data)}
            message_id = await writer.send(data, properties)
            # The payload as a standby will see it (JSON round trip), so every replica applies the very same value.
            entry = LogEntry(
                next_version,
                json.loads(data)["payload"],
                term,
                FORMAT,
                message_id,
                previous,
                Seen("verified", self._signing),
            )
            self._apply(entry)  # unless the tail already read it back
            self.stats["appended"] += 1
            self._entries_total += 1
            self._bytes_total += len(data)
            self._maybe_snapshot()
            return entry

    # --- snapshots ------------------------------------------------------------------------

    def _maybe_snapshot(self) -> None:
        entries, size = self._entries_total - self._snapshot_mark[0], self._bytes_total - self._snapshot_mark[1]
        if entries >= self.snapshot_every or size >= self.snapshot_bytes:
            self._start_snapshot()

    def _start_snapshot(self) -> None:
        if self._snapshot_task is None:
            self._snapshot_task = asyncio.create_task(
                self._snapshot_in_background(), name=f"snapshot:{self.snapshot_topic}"
            )

    @property
    def _signing(self) -> str | None:
        """The key id this replica signs with (None: unsigned)."""
        return self._key.signing if self._key is not None else None

    async def _snapshot_in_background(self) -> None:
        try:
            await self.write_snapshot()
        except (TransportError, ReplicationError) as exc:
            log.warning("log.snapshot_failed", topic=self.snapshot_topic, error=str(exc))
        finally:
            self._snapshot_task = None

    async def write_snapshot(self) -> Manifest:
        """Write the whole state as a snapshot (active only); its manifest."""
        self._check_failed()
        async with self._snapshotting:
            writer = self._snapshot_writer
            if writer is None:
                raise NotActive(f"only the active replica writes snapshots on {self.snapshot_topic}")
            started = time.monotonic()
            # Captured in one go, with no await in between: exactly the state at `version`.
            version, position, term, mark = (
                self.version,
                self.position,
                self.term,
                (self._entries_total, self._bytes_total),
            )
            chunks, items = pack(self._state.snapshot(), self._chunk_bytes)
            self.manifest = await send_snapshot(
                writer,
                self._key,
                chunks,
                version=version,
                term=term,
                position=position,
                items=items,
                previous=self.manifest,
            )
            self._snapshot_mark = mark
            self._core.snapshot_written(self._signing)
            self.stats["snapshots"] += 1
            log.info(
                "log.snapshot_written",
                topic=self.snapshot_topic,
                version=version,
                items=items,
                chunks=self.manifest.chunks,
                bytes=self.manifest.size,
                seconds=round(time.monotonic() - started, 3),
            )
            return self.manifest

    async def _restore(self) -> None:
        """Start from the last complete snapshot, if there is one and it is whole."""
        manifest = await last_manifest(self._transport, self.snapshot_topic, self._snapshots)
        if manifest is None:
            return
        chunks = await read_chunks(self._transport, self.snapshot_topic, manifest, self._snapshots)
        if chunks is None:
            return
        self._state.restore(manifest.version, items_of(chunks))
        self.position, self.term, self.manifest = manifest.position, manifest.term, manifest
        self._core.restored(manifest.version, manifest.position, manifest.signer)
        self.stats["restored_items"] = manifest.items

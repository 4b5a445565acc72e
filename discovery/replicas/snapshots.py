"""Snapshots of a replicated log: the manifest that names one, and how its chunks are packed, read and checked.

A snapshot is a run of chunks (JSON arrays of the state's items, about
`CHUNK_BYTES` each, well under the broker's message limit) followed by a
manifest naming them, the version and log position it covers and their
sha256, all on the log's snapshot topic. A snapshot cut short (its writer
died or was deposed) has no manifest; its chunks name the complete one
before (`previous`), which a reader falls back to. A chunk missing or a
digest that does not match makes the whole snapshot unusable, never half of
it: the reader starts from the log instead. `log.ReplicatedLog` writes them.

With a group key every chunk and manifest carries a MAC (`records.sign`; a
chunk's covers its snapshot, place and the complete snapshot it names): a
snapshot whose manifest or any chunk does not check (written by anyone but a
replica, with a sha256 of its own making) is refused, logged, and never
restored. A manifest out of range is refused the same way.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from discovery.errors import NewerFormat, ReplicationError
from toolservice_base.logs import get_logger
from toolservice_base.transport import MESSAGE_LIMIT, Envelope, ReaderStart, Transport, unique_name

from .elected import ElectedWriter
from .groupkey import MAC_PROPERTY, GroupKey, signer_of
from .records import Malformed, RecordCheck, counter, moment, sign, text

__all__ = [
    "CHUNK_BYTES",
    "ITEM_LIMIT",
    "READ_TIMEOUT",
    "SNAPSHOT_FORMAT",
    "Manifest",
    "b64",
    "chunk_properties",
    "manifest_message",
    "items_of",
    "last_manifest",
    "pack",
    "read_chunks",
    "send_snapshot",
    "unb64",
]

log = get_logger("discovery.replicas.log")

SNAPSHOT_FORMAT = 1
"""The snapshot (manifest and chunk) format this version writes and the newest it reads."""
CHUNK_BYTES = 1024 * 1024
"""A snapshot chunk's target size: a fifth of the broker's message limit, so no message comes near it."""
ITEM_LIMIT = MESSAGE_LIMIT - 64 * 1024
"""The largest single item a snapshot can carry (it goes alone in its chunk)."""
READ_TIMEOUT = 10.0
"""How long a read may take once the broker said a message is there (a slow broker, not an empty topic)."""
CHUNK_KIND, MANIFEST_KIND = "chunk", "manifest"
"""What a chunk's and a manifest's MACs say they are (`groupkey`)."""
MAX_CHUNKS = 1_000_000
"""The most chunks a manifest may name (a terabyte of state at the chunk size): more is not a manifest of ours."""


@dataclass(frozen=True)
class Manifest:
    """The last message of a complete snapshot: what it covers and where its chunks are."""

    snapshot: str
    version: int
    term: int
    position: bytes
    """The log message id of the entry at `version` (empty: the log's start)."""
    first_chunk: bytes
    chunks: int
    items: int
    size: int
    sha256: str
    written_at: float
    format: int = SNAPSHOT_FORMAT
    message_id: bytes = b""
    """Where the manifest itself sits in the snapshot topic."""
    signer: str | None = None
    """The group key id its MAC names, as read (None: unsigned): a rotation's step 2 writes a snapshot under the new
    key when the one restored is under another (`ReplicaCore.on_caught_up`)."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "snapshot": self.snapshot,
            "version": self.version,
            "term": self.term,
            "position": b64(self.position),
            "first_chunk": b64(self.first_chunk),
            "chunks": self.chunks,
            "items": self.items,
            "bytes": self.size,
            "sha256": self.sha256,
            "written_at": self.written_at,
        }

    @classmethod
    def from_wire(cls, envelope: Envelope) -> "Manifest":
        """The manifest in a message; `Malformed` if it is not one, `NewerFormat` if a newer version wrote it."""
        try:
            raw = json.loads(envelope.data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise Malformed("not JSON") from None
        if not isinstance(raw, dict):
            raise Malformed("not a JSON object")
        snapshot_format = counter(raw, "format", low=1)
        if snapshot_format > SNAPSHOT_FORMAT:
            raise NewerFormat(
                f"the snapshot on {envelope.topic} was written by a newer version (format {snapshot_format}, this one"
                f" reads up to {SNAPSHOT_FORMAT}); upgrade tool-discovery on this replica"
            )
        try:
            position, first_chunk = unb64(text(raw, "position")), unb64(text(raw, "first_chunk"))
        except (ValueError, binascii.Error):
            raise Malformed("a position that is not base64") from None
        if (chunks := counter(raw, "chunks")) > MAX_CHUNKS:
            raise Malformed(f"{chunks} chunks")
        return cls(
            snapshot=text(raw, "snapshot"),
            version=counter(raw, "version"),
            term=counter(raw, "term", default=0),
            position=position,
            first_chunk=first_chunk,
            chunks=chunks,
            items=counter(raw, "items"),
            size=counter(raw, "bytes"),
            sha256=text(raw, "sha256"),
            written_at=moment(raw, "written_at"),
            format=snapshot_format,
            message_id=envelope.message_id,
            signer=signer_of(envelope.properties.get(MAC_PROPERTY)),
        )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(encoded: str) -> bytes:
    return base64.b64decode(encoded.encode(), validate=True) if encoded else b""


def chunk_properties(
    key: GroupKey | None, topic: str, chunk: bytes, snapshot: str, seq: int, previous: str
) -> dict[str, str]:
    """What a chunk carries beside its bytes: its snapshot, place, the complete snapshot before, and its MAC."""
    properties = {"kind": "chunk", "snapshot": snapshot, "seq": str(seq), "previous": previous}
    return {**properties, **sign(key, CHUNK_KIND, topic, chunk, snapshot, str(seq), previous)}


def manifest_message(key: GroupKey | None, topic: str, manifest: Manifest) -> tuple[bytes, dict[str, str]]:
    """A manifest as sent: its bytes, and its properties (with its MAC)."""
    data = json.dumps(manifest.to_wire(), separators=(",", ":")).encode()
    return data, {"kind": "manifest", "snapshot": manifest.snapshot, **sign(key, MANIFEST_KIND, topic, data)}


async def send_snapshot(
    writer: ElectedWriter,
    key: GroupKey | None,
    chunks: list[bytes],
    *,
    version: int,
    term: int,
    position: bytes,
    items: int,
    previous: Manifest | None,
) -> Manifest:
    """Send a snapshot's chunks, then its manifest (each signed with `key`) through the active's writer; the manifest.

    Each chunk names the complete snapshot before (`previous`), for a reader
    that finds this one cut short.
    """
    snapshot_id = unique_name("snapshot")
    before = b64(previous.message_id) if previous else ""
    digest = hashlib.sha256()
    first_chunk = b""
    for seq, chunk in enumerate(chunks):
        digest.update(chunk)
        message_id = await writer.send(chunk, chunk_properties(key, writer.topic, chunk, snapshot_id, seq, before))
        first_chunk = first_chunk or message_id
    manifest = Manifest(
        snapshot=snapshot_id,
        version=version,
        term=term,
        position=position,
        first_chunk=first_chunk,
        chunks=len(chunks),
        items=items,
        size=sum(len(chunk) for chunk in chunks),
        sha256=digest.hexdigest(),
        written_at=time.time(),
    )
    message_id = await writer.send(*manifest_message(key, writer.topic, manifest))
    return replace(manifest, message_id=message_id, signer=key.signing if key is not None else None)


def _chunk_checks(check: RecordCheck, chunk: Envelope) -> bool:
    """Whether a chunk checks under the group key (always, without one); refused (logged) if not."""
    props = chunk.properties
    context = (props.get("snapshot", ""), props.get("seq", ""), props.get("previous", ""))
    forged = check.forgery(chunk, CHUNK_KIND, *context)
    if forged is not None:
        check.refuse(chunk, CHUNK_KIND, f"{forged}; the log is replayed instead")
        return False
    return True


def pack(state: Iterable[Any], chunk_bytes: int) -> tuple[list[bytes], int]:
    """The state's items as JSON arrays of about `chunk_bytes` each (an item alone if larger); and how many
    items."""
    chunks: list[bytes] = []
    current: list[bytes] = []
    size = count = 0
    for item in state:
        encoded = json.dumps(item, separators=(",", ":")).encode()
        if len(encoded) > ITEM_LIMIT:
            raise ReplicationError(
                f"one item of the state is {len(encoded)} bytes, over the {ITEM_LIMIT}-byte limit of a snapshot"
                " chunk; store less in one item"
            )
        if current and size + len(encoded) + 1 > chunk_bytes:
            chunks.append(b"[" + b",".join(current) + b"]")
            current, size = [], 0
        current.append(encoded)
        size += len(encoded) + 1
        count += 1
    if current:
        chunks.append(b"[" + b",".join(current) + b"]")
    return chunks, count


def items_of(chunks: list[bytes]) -> Iterator[Any]:
    """The items of a snapshot, one chunk decoded at a time."""
    for chunk in chunks:
        yield from json.loads(chunk)


async def last_manifest(transport: Transport, topic: str, check: RecordCheck) -> Manifest | None:
    """The manifest of the topic's last complete snapshot; None if there is none (or it is unreadable, or does not
    check: logged)."""
    last = await _read_one(transport, topic, "latest")
    if last is not None and last.properties.get("kind") == "chunk":
        # A snapshot cut short (its writer died or was deposed): its chunks name the complete one before.
        if not _chunk_checks(check, last):
            return None
        try:
            previous = unb64(last.properties.get("previous", ""))
        except (ValueError, binascii.Error):
            previous = b""
        last = await _read_one(transport, topic, previous) if previous else None
    if last is None:
        return None
    forged = check.forgery(last, MANIFEST_KIND)
    if forged is not None:
        check.refuse(last, MANIFEST_KIND, f"{forged}; the log is replayed instead")
        return None
    try:
        return Manifest.from_wire(last)
    except Malformed as exc:
        check.refuse(last, MANIFEST_KIND, f"not a snapshot manifest ({exc}); the log is replayed instead")
        return None


async def _read_one(transport: Transport, topic: str, start: ReaderStart) -> Envelope | None:
    """The message at `start` (a message id, inclusive, or the latest); None if the topic has none."""
    reader = await transport.reader(topic, start, inclusive=True)
    try:
        if not await reader.has_message_available():
            return None
        return await reader.read_next(READ_TIMEOUT)
    finally:
        await transport.close_reader(reader)


async def read_chunks(transport: Transport, topic: str, manifest: Manifest, check: RecordCheck) -> list[bytes] | None:
    """The snapshot's chunks, checked against its manifest and the group key; None (logged) if any is missing or
    wrong."""
    if manifest.chunks == 0:
        return []
    reader = await transport.reader(topic, manifest.first_chunk, inclusive=True)
    chunks: list[bytes] = []
    digest = hashlib.sha256()
    try:
        for seq in range(manifest.chunks):
            chunk = await reader.read_next(READ_TIMEOUT)
            if (
                chunk is None
                or chunk.properties.get("snapshot") != manifest.snapshot
                or chunk.properties.get("seq") != str(seq)
            ):
                log.warning(
                    "log.snapshot_skipped",
                    topic=topic,
                    snapshot=manifest.snapshot,
                    reason=f"chunk {seq} missing",
                )
                return None
            if not _chunk_checks(check, chunk):
                return None
            digest.update(chunk.data)
            chunks.append(chunk.data)
    finally:
        await transport.close_reader(reader)
    if digest.hexdigest() != manifest.sha256:
        log.warning("log.snapshot_skipped", topic=topic, snapshot=manifest.snapshot, reason="digest mismatch")
        return None
    return chunks

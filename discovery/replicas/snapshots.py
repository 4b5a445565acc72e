"""Snapshots of a replicated log: the manifest that names one, and how its chunks are packed, read and checked.

A snapshot is a run of chunks (JSON arrays of the state's items, about
`CHUNK_BYTES` each, well under the broker's message limit) followed by a
manifest naming them, the version and log position it covers and their
sha256, all on the log's snapshot topic. A snapshot cut short (its writer
died or was deposed) has no manifest; its chunks name the complete one
before (`previous`), which a reader falls back to. A chunk missing or a
digest that does not match makes the whole snapshot unusable, never half of
it: the reader starts from the log instead. `log.ReplicatedLog` writes them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from discovery.errors import NewerFormat, ReplicationError
from toolservice_base.logs import get_logger
from toolservice_base.transport import MESSAGE_LIMIT, Envelope, ReaderStart, Transport

__all__ = [
    "CHUNK_BYTES",
    "ITEM_LIMIT",
    "READ_TIMEOUT",
    "SNAPSHOT_FORMAT",
    "Manifest",
    "b64",
    "items_of",
    "last_manifest",
    "pack",
    "read_chunks",
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
        raw = json.loads(envelope.data)
        if int(raw["format"]) > SNAPSHOT_FORMAT:
            raise NewerFormat(
                f"the snapshot on {envelope.topic} was written by a newer version (format {raw['format']}, this one"
                f" reads up to {SNAPSHOT_FORMAT}); upgrade tool-discovery on this replica"
            )
        return cls(
            snapshot=str(raw["snapshot"]),
            version=int(raw["version"]),
            term=int(raw.get("term", 0)),
            position=unb64(raw["position"]),
            first_chunk=unb64(raw["first_chunk"]),
            chunks=int(raw["chunks"]),
            items=int(raw["items"]),
            size=int(raw["bytes"]),
            sha256=str(raw["sha256"]),
            written_at=float(raw["written_at"]),
            format=int(raw["format"]),
            message_id=envelope.message_id,
        )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode()) if text else b""


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


async def last_manifest(transport: Transport, topic: str) -> Manifest | None:
    """The manifest of the topic's last complete snapshot; None if there is none (or it is unreadable, logged)."""
    last = await _read_one(transport, topic, "latest")
    if last is not None and last.properties.get("kind") == "chunk":
        # A snapshot cut short (its writer died or was deposed): its chunks name the complete one before.
        previous = unb64(last.properties.get("previous", ""))
        last = await _read_one(transport, topic, previous) if previous else None
    if last is None:
        return None
    try:
        return Manifest.from_wire(last)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("log.snapshot_skipped", topic=topic, reason=f"unreadable manifest ({exc})")
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


async def read_chunks(transport: Transport, topic: str, manifest: Manifest) -> list[bytes] | None:
    """The snapshot's chunks, checked against its manifest; None (logged) if any is missing or wrong."""
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
            digest.update(chunk.data)
            chunks.append(chunk.data)
    finally:
        await transport.close_reader(reader)
    if digest.hexdigest() != manifest.sha256:
        log.warning("log.snapshot_skipped", topic=topic, snapshot=manifest.snapshot, reason="digest mismatch")
        return None
    return chunks

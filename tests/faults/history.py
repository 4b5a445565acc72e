"""A history of config-store operations: each one's invocation, completion and result, one JSON line each.

What `lincheck` (porcupine) and `check` read. Times are `time.monotonic_ns()`
of the recording process. An operation whose outcome a client cannot know (a
timeout, an error that does not say the write was not made) is `unknown`:
it may have happened, at any moment after its invocation, or never.

A line::

    {"id": 7, "client": 2, "call": 1234, "return": 5678, "op": "write",
     "puts": [["k0", "c2-7"]], "deletes": [], "expect": [{"key": "k0", "value": "c1-3"}],
     "status": "ok", "version": 41}
    {"id": 8, "client": 0, "call": ..., "op": "read", "keys": ["k0", "k1", "k2"],
     "status": "ok", "version": 41, "values": {"k0": "c2-7", "k1": null, "k2": "c0-5"}}
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

Status = Literal["ok", "conflict", "unknown", "fail"]


@dataclass(slots=True)
class Op:
    id: int
    client: int
    op: Literal["read", "write"]
    call: int
    keys: list[str] = field(default_factory=list)
    puts: list[tuple[str, str]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    expect: list[dict[str, str | None]] = field(default_factory=list)
    status: Status = "unknown"
    version: int = 0
    values: dict[str, str | None] = field(default_factory=dict)
    error: str = ""
    """What the client was told, for an op that did not succeed."""
    return_: int | None = None

    def to_json(self) -> str:
        raw = asdict(self)
        raw["return"] = raw.pop("return_")
        return json.dumps(raw, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> "Op":
        raw = json.loads(line)
        raw["return_"] = raw.pop("return")
        raw["puts"] = [tuple(p) for p in raw["puts"]]
        return cls(**raw)

    @property
    def acknowledged(self) -> bool:
        return self.op == "write" and self.status == "ok"

    def seconds(self, origin: int) -> tuple[float, float | None]:
        """(invoked, completed) in seconds since `origin` (ns)."""
        done = None if self.return_ is None else (self.return_ - origin) / 1e9
        return (self.call - origin) / 1e9, done


class History:
    """Recorded as operations complete (appended and flushed, so a crash keeps what came before)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = open(path, "a")
        self._next = 0
        self.ops: list[Op] = []

    def invoke(self, client: int, op: Literal["read", "write"], **fields: Any) -> Op:
        self._next += 1
        return Op(id=self._next, client=client, op=op, call=time.monotonic_ns(), **fields)

    def complete(self, op: Op, status: Status, *, version: int = 0, error: str = "", **fields: Any) -> None:
        op.return_ = time.monotonic_ns()
        op.status, op.version, op.error = status, version, error
        for name, value in fields.items():
            setattr(op, name, value)
        self._record(op)

    def unanswered(self, op: Op, error: str) -> None:
        """No answer, or one that does not say whether a write was made. `return` is when the client gave up: the
        checker takes the write as possibly made at any moment after its invocation, and leaves such a read out."""
        op.return_ = time.monotonic_ns()
        op.status, op.error = "unknown", error
        self._record(op)

    def _record(self, op: Op) -> None:
        self.ops.append(op)
        self._file.write(op.to_json() + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read(path: Path) -> list[Op]:
    return list(_lines(path))


def _lines(path: Path) -> Iterator[Op]:
    with open(path) as handle:
        for line in handle:
            if line.strip():
                yield Op.from_json(line)

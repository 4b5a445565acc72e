"""Concurrent clients doing what users of the config store do, on a few keys, every operation recorded.

Each client runs one operation at a time through `ConfigClient`, as a
process of Jepsen's would: reads of every key, puts of one key, batches
(one put of every key: all or nothing), conditional writes (`expect` the
value this client last saw) and deletes. Every value written is unique
(`c<client>-<n>`), so a read names the write it saw. Choices come from one
seeded `random.Random`: the same seed makes the same mix.

Every write also puts its own value under the client's marker key
(`w<client>`), so each write that takes effect is one entry of the
replicated log that names it: the checker learns from the log whether a
write that timed out was made, and at which version (as etcd's robustness
tests learn it from the WAL), instead of trying both.

Timeouts are long (`TIMEOUT`): an answer that arrives late is still an
answer, and a stale one must reach the checker, not vanish in a timeout.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from toolservice_base import ConfigClient
from toolservice_base.errors import ConfigConflict, ConfigError, ConfigRefused, ToolDiscoveryError

from .history import History, Op

ITEM_TYPE = "fault-note"
KEYS = ("k0", "k1", "k2")
TIMEOUT = 12.0
"""Seconds a client waits for an answer: longer than any fault a schedule holds a link or a process in."""
MIX = {"read": 40, "put": 20, "batch": 10, "cas": 20, "delete": 10}
"""Weights of the operations."""
PAUSE = 0.02
"""Seconds a client waits between its operations."""


@dataclass
class Workload:
    """`clients` clients on `client`'s connection, choosing with `seed`; `run` until `stop` is set."""

    history: History
    seed: int
    clients: int = 4
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    seen: dict[int, dict[str, str | None]] = field(default_factory=dict)
    """What each client last saw of each key (what its conditional writes expect)."""

    async def run(self, client: ConfigClient) -> None:
        await asyncio.gather(*(self._client(client, n, random.Random(f"{self.seed}/{n}")) for n in range(self.clients)))

    async def _client(self, client: ConfigClient, n: int, rng: random.Random) -> None:
        self.seen[n] = {}
        count = 0
        kinds, weights = list(MIX), list(MIX.values())
        while not self.stop.is_set():
            count += 1
            kind = rng.choices(kinds, weights)[0]
            await self.one(client, n, kind, f"c{n}-{count}", rng)
            await asyncio.sleep(PAUSE)

    async def one(self, client: ConfigClient, n: int, kind: str, value: str, rng: random.Random) -> Op:
        """One operation of client `n`, recorded."""
        key = rng.choice(KEYS)
        if kind == "read":
            return await self.read(client, n)
        marker = (marker_key(n), value)
        if kind == "put":
            op = self.history.invoke(n, "write", puts=[(key, value), marker])
        elif kind == "batch":
            op = self.history.invoke(n, "write", puts=[*((k, value) for k in KEYS), marker])
        elif kind == "cas":
            expected = self.seen.get(n, {}).get(key)
            op = self.history.invoke(n, "write", puts=[(key, value), marker], expect=[{"key": key, "value": expected}])
        else:
            op = self.history.invoke(n, "write", puts=[marker], deletes=[key])
        await self._write(client, op)
        return op

    async def read(self, client: ConfigClient, n: int, timeout: float = TIMEOUT) -> Op:
        op = self.history.invoke(n, "read", keys=list(KEYS))
        try:
            async with asyncio.timeout(timeout):
                version, found = await client.snapshot([(ITEM_TYPE, k) for k in KEYS])
        except (ToolDiscoveryError, TimeoutError) as exc:
            self.history.unanswered(op, _said(exc))
            return op
        values = {k: found.get((ITEM_TYPE, k)) for k in KEYS}
        self.seen[n] = dict(values)
        self.history.complete(op, "ok", version=version, values=values)
        return op

    async def _write(self, client: ConfigClient, op: Op) -> None:
        try:
            async with asyncio.timeout(TIMEOUT):
                version = await client.apply(
                    puts=[(ITEM_TYPE, k, v) for k, v in op.puts],
                    deletes=[(ITEM_TYPE, k) for k in op.deletes],
                    expect=[(ITEM_TYPE, str(e["key"]), e["value"]) for e in op.expect],
                )
        except ConfigConflict as exc:
            self.history.complete(op, "conflict", error=_said(exc))
            return
        except ConfigRefused:
            raise  # refused before sending or as invalid: the workload is wrong, not the store
        except (ConfigError, ToolDiscoveryError, TimeoutError) as exc:
            self.history.unanswered(op, _said(exc))
            return
        self.history.complete(op, "ok", version=version)
        mine = self.seen.setdefault(op.client, {})
        mine.update(dict(op.puts))
        mine.update({k: None for k in op.deletes})


def marker_key(client: int) -> str:
    """The key each write of `client` also puts its value under: no two writes of the run write the same value there."""
    return f"w{client}"


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"

"""`toolreg` with one safety removed, for the checker to catch: a replica answers reads without confirming it is active.

    python tests/faults/unsafe.py up --store pulsar ...

An active replica confirms it still holds the lock before it answers a read
(`LogJournal.confirm`), and steps down on the first sign it was deposed: its
lock lost, a newer term heard, a write fenced or not made durable. Here it
answers reads from its state without confirming anything, and takes none of
those signs as a reason to stop: a replica cut off and replaced goes on
answering reads from its old state (its writes fail, fenced by the broker),
so a reader that already saw a newer version sees an older one. Test-only:
nothing in the product imports this.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any


def _reads_unconfirmed_and_never_deposed() -> None:
    from discovery.replicas import election
    from discovery.store import log_state, service

    async def hold(self: Any, lock: Any, mode: Any) -> str:
        await asyncio.Event().wait()  # until closed
        return "closing"

    def deposed(self: Any, reason: str) -> None:
        return None

    async def confirm(self: Any) -> None:
        return None

    make_durable = service.ConfigStoreService._make_durable

    async def durable_or_not(self: Any, outcome: Any, operation: str) -> Any:
        answered = await make_durable(self, outcome, operation)
        self.damaged = None  # goes on answering from its state
        return answered

    election.Election._hold = hold  # type: ignore[method-assign]
    election.Election.deposed = deposed  # type: ignore[method-assign]
    log_state.LogJournal.confirm = confirm  # type: ignore[method-assign,assignment]
    service.ConfigStoreService._make_durable = durable_or_not  # type: ignore[method-assign]


def main() -> int:
    _reads_unconfirmed_and_never_deposed()
    from discovery.cli.main import main as toolreg

    return int(toolreg(sys.argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())

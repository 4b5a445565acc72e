"""`toolreg` with one safety removed, for the checker to catch: a replica answers reads without confirming it is active.

    python tests/faults/unsafe.py up --store pulsar ...

An active replica confirms it still holds the lock before it answers a read
(`LogJournal.confirm`), and steps down on the first sign it was deposed
(`ReplicaCore.active_look`, `ReplicaCore.deposed`): its lock lost, a newer
term heard, a write fenced or not made durable. Here it
answers reads from its state without confirming anything, and takes none of
those signs as a reason to stop: a replica cut off and replaced goes on
answering reads from its old state (its writes fail, fenced by the broker),
so a reader that already saw a newer version sees an older one. Test-only:
nothing in the product imports this.
"""

from __future__ import annotations

import sys
from typing import Any


def _reads_unconfirmed_and_never_deposed() -> None:
    """The core's step-down rules switched off (no sign of deposition heeded), and the journal's confirmation."""
    from discovery.replicas.core import ReplicaCore, Wait
    from discovery.store import log_state, service

    def active_look(self: Any, now: float, lock_connected: bool, claim: Any) -> Wait:
        return Wait()  # never steps down

    def deposed(self: Any, reason: str) -> bool:
        return False

    async def confirm(self: Any) -> None:
        return None

    make_durable = service.ConfigStoreService._make_durable

    async def durable_or_not(self: Any, *args: Any, **kwargs: Any) -> Any:
        answered = await make_durable(self, *args, **kwargs)
        self.damaged = None  # goes on answering from its state
        return answered

    ReplicaCore.active_look = active_look  # type: ignore[method-assign,assignment]
    ReplicaCore.deposed = deposed  # type: ignore[method-assign]
    log_state.LogJournal.confirm = confirm  # type: ignore[method-assign,assignment]
    service.ConfigStoreService._make_durable = durable_or_not  # type: ignore[method-assign]


def main() -> int:
    _reads_unconfirmed_and_never_deposed()
    from discovery.cli.main import main as toolreg

    return int(toolreg(sys.argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""`toolreg` with one safety removed, for the checker to catch: a deposed active replica goes on answering reads.

    python tests/faults/unsafe.py up --store pulsar ...

The election steps a replica down on the first sign it was deposed: its lock
lost, a newer term heard, or a write fenced. Here it steps down on a fenced
write only, so a replica cut off and deposed serves reads from its old state
until a write reaches it: a reader that already saw a newer version sees an
older one. Test-only: nothing in the product imports this.
"""

from __future__ import annotations

import sys
from typing import Any


def _only_fenced_writes_depose() -> None:
    from discovery.replicas import election
    from discovery.replicas.membership import wait_event

    async def hold(self: Any, lock: Any, mode: Any) -> str:
        while True:
            if await wait_event(self._lost, self._check_interval):
                return str(self._lost_reason)

    election.Election._hold = hold  # type: ignore[method-assign]


def main() -> int:
    _only_fenced_writes_depose()
    from discovery.cli.main import main as toolreg

    return int(toolreg(sys.argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())

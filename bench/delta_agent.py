"""One agent of the deltas benchmark: a `ToolSet` in a process of its own, saying when it holds each version.

    python -m bench.delta_agent OUT [--full-reads]

Writes `<version> <wall clock>` to OUT after each swap (the bench reads the
file as it grows), `ready <version>` once loaded, and on SIGTERM
`reads <full> <delta>` before it exits. `--full-reads`: the agent asks
every reload for every tool, as a store without a change feed makes it do
(the reference).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from agent_bridge import ToolSet
from toolservice_base import Settings


async def main(out: Path, full_reads: bool) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    data_dir = out.parent / f"{out.stem}-data"
    with open(out, "a", buffering=1) as said:
        async with ToolSet(
            settings=Settings.from_env(), data_dir=data_dir, poll_interval=60, store_timeout=30
        ) as tools:
            reload = tools._reload
            reload._feed = not full_reads
            tools.on_change(lambda added, removed, changed, version: said.write(f"{version} {time.time()}\n"))
            said.write(f"ready {tools.version}\n")
            await stop.wait()
            said.write(f"reads {reload.full_reads} {reload.delta_reads}\n")


if __name__ == "__main__":
    os.environ.setdefault("TOOLREG_LOG_LEVEL", "warning")
    asyncio.run(main(Path(sys.argv[1]), "--full-reads" in sys.argv[2:]))

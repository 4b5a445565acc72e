"""What the search index costs an agent: the price of building it eagerly, paid by agents that never search.

`python -m bench.search_eager N` starts a `ToolSet` of N tools (the search corpus, from a static directory on the
in-memory transport) in a process of its own, then searches once, and prints as JSON the process's resident
memory and thread count before and after, and the CPU and wall time of that first search (which builds the
index, tantivy's import included). `b_search` runs it at 50 and 10,000 tools: that is what every agent would pay
at its start if the index were built there rather than when a search first asks for it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


async def measure(count: int) -> dict[str, Any]:
    import psutil

    from .b_search import live

    process = psutil.Process()
    tools = await live(Path(tempfile.mkdtemp(prefix="bench-search-eager-")), count)
    try:
        gc.collect()
        await asyncio.sleep(0.5)
        rss, threads = process.memory_info().rss, process.num_threads()
        cpu, started = time.process_time(), time.perf_counter()
        await tools.search("create an issue", 5)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - started
        gc.collect()
        await asyncio.sleep(1.0)  # tantivy's threads settle
        return {
            "tools": count,
            "rss_before_mb": round(rss / 2**20, 1),
            "rss_added_mb": round((process.memory_info().rss - rss) / 2**20, 1),
            "threads_added": process.num_threads() - threads,
            "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 3),
        }
    finally:
        await tools.close()


async def eager_cost(count: int) -> dict[str, Any]:
    """`measure(count)` in a fresh process, so nothing another benchmark loaded is counted or left out."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.search_eager", str(count), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"bench.search_eager {count} exited {child.returncode}")
    found: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return found


if __name__ == "__main__":
    from toolservice_base import configure_logging

    configure_logging("error")
    print(json.dumps(asyncio.run(measure(int(sys.argv[1])))))

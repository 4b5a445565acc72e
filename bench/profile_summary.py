"""Summarise a py-spy raw (collapsed) profile: the functions where samples are spent, self and total.

    python -m bench.profile_summary FILE [--top 25] [--filter discovery] [--thread MainThread] [--layers]

`--thread` keeps the samples of one thread (profiles taken with `--threads`, as
`--profile` does for the invoke benchmark): the event loop's thread is where a
call's latency is spent; the client library's I/O threads mostly wait.
`--layers` adds up each sample by the layer it was spent in (ours, pydantic,
asyncio, pulsar-client's Python or C++ side, waiting in epoll).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

OURS = ("toolservice_base/", "agent_bridge/", "discovery/")


def layer(frames: list[str]) -> str:
    """The layer one sample was spent in, judged from its whole stack (innermost first where it matters)."""
    stack = ";".join(frames)
    leaf = frames[-1]
    if "select_epoll_poll" in stack or leaf.startswith("epoll_wait"):
        return "waiting in epoll (idle, or taking the GIL back)"
    for marker, name in (
        ("receiveAsync", "pulsar-client C++: receive"),
        ("sendAsync", "pulsar-client C++: send"),
        ("acknowledgeAsync", "pulsar-client C++: acknowledge"),
        ("gil_scoped_acquire", "pulsar-client callback taking the GIL"),
    ):
        if marker in stack:
            return name
    if "pydantic" in stack:  # pydantic-core's native frames carry no Python file
        return "pydantic"
    python = [f for f in frames if ".py:" in f]
    innermost = python[-1] if python else leaf
    for marker, name in (
        ("json/", "json"),
        ("structlog", "logging"),
        ("prometheus_client", "metrics"),
        ("pulsar/", "pulsar-client Python wrapper"),
        ("asyncio/", "asyncio"),
        ("selectors.py", "asyncio"),
    ):
        if marker in innermost:
            return name
    if any(part in innermost for part in OURS):
        return "our code (own frames)"
    return "other"


def summarise(path: Path, top: int, only: str | None, thread: str | None = None, layers: bool = False) -> str:
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    by_layer: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        if thread is not None:
            if not frames[0].startswith("thread (") or thread not in frames[0]:
                continue
            frames = frames[1:]
        samples += count
        own[frames[-1]] += count
        if layers:
            by_layer[layer(frames)] += count
        for frame in set(frames):
            total[frame] += count
    if not samples:
        return f"no samples{f' from a thread named like {thread!r}' if thread else ''} in {path}"
    lines = [f"{samples} samples", ""]
    if layers:
        lines += ["layer %  layer"] + [f"{100 * n / samples:5.1f}  {name}" for name, n in by_layer.most_common()] + [""]
    lines += ["self %  function"]
    lines += [f"{100 * n / samples:5.1f}  {f}" for f, n in own.most_common(top) if not only or only in f]
    lines += ["", "total %  function"]
    lines += [f"{100 * n / samples:5.1f}  {f}" for f, n in total.most_common(top * 4) if not only or only in f][:top]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--filter", default=None)
    parser.add_argument("--thread", default=None, help="only the samples of the thread whose name contains this")
    parser.add_argument("--layers", action="store_true", help="add up the samples by layer first")
    args = parser.parse_args()
    print(summarise(args.file, args.top, args.filter, args.thread, args.layers))

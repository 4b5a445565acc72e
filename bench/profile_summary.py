"""Summarise a py-spy raw (collapsed) profile: the functions where samples are spent, self and total.

    python -m bench.profile_summary FILE [--top 25] [--filter discovery] [--thread MainThread]

`--thread` keeps the samples of one thread (profiles taken with `--threads`, as
`--profile` does for the invoke benchmark): the event loop's thread is where a
call's latency is spent; the client library's I/O threads mostly wait.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def summarise(path: Path, top: int, only: str | None, thread: str | None = None) -> str:
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
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
        for frame in set(frames):
            total[frame] += count
    if not samples:
        return f"no samples{f' from a thread named like {thread!r}' if thread else ''} in {path}"
    lines = [f"{samples} samples", "", "self %  function"]
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
    args = parser.parse_args()
    print(summarise(args.file, args.top, args.filter, args.thread))

"""`toolreg tools`: a workspace's tools as the registry sees them, once or kept up to date (`--watch`).

`--watch` works like `kubectl get --watch`: the listing first, then one row
for each tool that comes, changes or goes, each with the time it was seen and
ADDED, MODIFIED or DELETED. Nothing is redrawn, so the output reads the same
on a terminal, in a log file and through a pipe; with `--json` each change is
one JSON object on a line of its own (NDJSON, `{"type", "at", "object"}` as
`kubectl get --watch --output-watch-events -o json` writes them).

The watch asks the registry's query API every `--interval` seconds. A push
would not do: a tool's status, instances and WHY are the registry's view of
its leases at the moment it is asked (a lease running out writes nothing to
the store until the removal), so only the registry can say them.

When the registry stops answering (it restarts, fails over, the broker goes
away), one line on stderr says so and the watch keeps asking; another says
when it answers again, and the rows that follow are what changed meanwhile.
`kubectl get --watch` ends when its watch does instead, which its users
have long counted as a bug; a watch started to see a failover through must
outlive it. Ctrl-C (or SIGTERM) ends the watch with exit code 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Sequence

from discovery.errors import RegistryUnavailable
from discovery.registry.client import Listing, RegistryClient
from discovery.registry.protocol import ToolStatus
from toolservice_base.errors import TransportError

from .common import CommandError
from .output import Column, output_format, render
from .registry import HELD_EXIT, SHORT, age, answering, ask_registry, record, registry_client

DEFAULT_INTERVAL = 1.0
"""Seconds between two questions of `toolreg tools --watch` (`--interval`)."""
MIN_WIDTHS = {
    "TIME": 19,
    "EVENT": 8,
    "TOOL": 16,
    "SERVICE": 16,
    "SOURCE": 9,
    "STATUS": 11,
    "INSTANCES": 9,
    "DIGEST": SHORT,
}
"""Columns of a watch start this wide (a time, MODIFIED, the longest source and status, typical names), so the rows
printed later, one at a time, mostly line up with the first ones; a wider cell widens its column from then on."""
WATCHED = ("service", "source", "status", "instances", "detail", "digest", "version", "workspace")
"""What makes a row MODIFIED: everything the listing says of a tool but the age of its last heartbeat,
which changes on every look."""


def held_notice(held: Sequence[str]) -> str:
    """What `toolreg tools` says on stderr while self-preservation holds the removal of `held` services."""
    return (
        f"self-preservation is holding the removal of {', '.join(held)}: their leases ran out together; "
        "they come back if their heartbeats resume, or run `toolreg release` to remove them"
    )


def tool_headers(pinning: bool, heartbeat: bool = True) -> list[str]:
    """The columns of a tool's row; DIGEST (the pinned definition, before WHY) only when the registry pins
    definitions."""
    return [
        "TOOL",
        "SERVICE",
        "SOURCE",
        "STATUS",
        "INSTANCES",
        *(["LAST HEARTBEAT"] if heartbeat else []),
        *(["DIGEST"] if pinning else []),
        "WHY",
    ]


def tool_row(tool: ToolStatus, pinning: bool, heartbeat: bool = True) -> list[str]:
    """One tool under `tool_headers(pinning, heartbeat)`."""
    instances = str(tool.instances) if tool.source == "announced" else "-"
    return [
        tool.name,
        tool.service or "-",
        tool.source,
        tool.status,
        instances,
        *([age(tool.last_heartbeat_age)] if heartbeat else []),
        *([(tool.digest or "-")[:SHORT]] if pinning else []),
        tool.detail,
    ]


def tool_columns(pinning: bool) -> list[Column[ToolStatus]]:
    """`toolreg tools`' columns: DIGEST (short) when the registry pins definitions; `-o wide` adds WORKSPACE, VERSION
    and the whole digest."""
    return [
        Column("TOOL", lambda t: t.name),
        Column("SERVICE", lambda t: t.service or "-"),
        Column("WORKSPACE", lambda t: t.workspace, wide=True),
        Column("SOURCE", lambda t: t.source),
        Column("STATUS", lambda t: t.status),
        Column("INSTANCES", lambda t: str(t.instances) if t.source == "announced" else "-"),
        Column("LAST HEARTBEAT", lambda t: age(t.last_heartbeat_age)),
        Column("VERSION", lambda t: t.version or "-", wide=True),
        *([Column("DIGEST", lambda t: (t.digest or "-")[:SHORT], narrow=True)] if pinning else []),
        Column("DIGEST", lambda t: t.digest or "-", wide=True),
        Column("WHY", lambda t: t.detail),
    ]


async def cmd_tools(args: argparse.Namespace) -> int:
    if args.watch:
        return await watch_tools(args)
    if args.search is not None:
        from .tool_search import cmd_search

        return await cmd_search(args)
    if args.interval is not None:
        raise CommandError("--interval is how often `toolreg tools --watch` asks; add --watch, or leave --interval out")
    output_format(args)  # two formats asked for: one line before anything is asked of the registry

    async def action(client: RegistryClient) -> int:
        listing = await client.list(args.workspace)
        if listing.held:
            print(f"toolreg: {held_notice(listing.held)}", file=sys.stderr)
        columns = tool_columns(listing.pinning)
        empty = f"no tools in workspace {args.workspace or 'default'!r}"
        render(args, listing.tools, columns, name=lambda t: t.name, record=record, empty=empty)
        return HELD_EXIT if args.strict and listing.held else 0

    return await ask_registry(args, action)


# --- --watch -----------------------------------------------------------------


Event = tuple[str, ToolStatus]
"""ADDED, MODIFIED or DELETED, and the tool as it is now (as it was last seen, for DELETED)."""


def changes(before: dict[str, ToolStatus], after: dict[str, ToolStatus]) -> list[Event]:
    """What happened between two listings, by tool name."""
    events: list[Event] = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old is None and new is not None:
            events.append(("ADDED", new))
        elif new is None and old is not None:
            events.append(("DELETED", old))
        elif (
            old is not None and new is not None and any(getattr(old, field) != getattr(new, field) for field in WATCHED)
        ):
            events.append(("MODIFIED", new))
    return events


def _now() -> str:
    """Local time to the second, one word (a row still splits on whitespace)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def _say(message: str) -> None:
    print(f"toolreg: {_now()} {message}", file=sys.stderr, flush=True)


class WatchOutput:
    """Prints the events of a watch: aligned rows under one header, or NDJSON."""

    def __init__(self, as_json: bool, pinning: bool) -> None:
        self.as_json = as_json
        self.pinning = pinning
        self._widths: list[int] = []

    def start(self, events: list[Event]) -> None:
        """The first listing: the header (on a table) and every tool as ADDED, aligned together."""
        if not self.as_json:
            self._widths = [max(len(header), MIN_WIDTHS.get(header, 0)) for header in self._headers()]
            for event, tool in events:
                self._widen(self._cells(event, tool))
            self._line(self._headers())
        self.show(events)

    def show(self, events: list[Event]) -> None:
        at = time.time()
        for event, tool in events:
            if self.as_json:  # DELETED: the tool as it was last seen, as kubectl gives a deleted object's last state
                print(
                    json.dumps({"type": event, "at": round(at, 3), "object": tool.model_dump(mode="json")}), flush=True
                )
            else:
                self._line(self._cells(event, tool))

    def _cells(self, event: str, tool: ToolStatus) -> list[str]:
        row = tool_row(tool, self.pinning, heartbeat=False)
        if event == "DELETED":  # no longer listed: it has no status, instances or WHY now
            row = [*row[:3], "-", "-", *(["-"] if self.pinning else []), ""]
        return [_now(), event, *row]

    def _headers(self) -> list[str]:
        return ["TIME", "EVENT", *tool_headers(self.pinning, heartbeat=False)]

    def _widen(self, cells: list[str]) -> None:
        self._widths = [max(width, len(cell)) for width, cell in zip(self._widths, cells)]

    def _line(self, cells: list[str]) -> None:
        """One row; a cell wider than its column so far widens it for the rows after (WHY, the last, is never
        padded)."""
        self._widen(cells)
        print("  ".join(cell.ljust(width) for cell, width in zip(cells, self._widths)).rstrip(), flush=True)


class Watch:
    """One `toolreg tools --watch`: what was last seen, and whether the registry answers."""

    def __init__(self, args: argparse.Namespace, first: Listing) -> None:
        self.args = args
        self.interval: float = args.interval or DEFAULT_INTERVAL
        self.output = WatchOutput(output_format(args) == "json", first.pinning)
        self.seen: dict[str, ToolStatus] = {}
        self.held: list[str] = []
        self.lost = False
        self.update(first, initial=True)

    def update(self, listing: Listing, *, initial: bool = False) -> None:
        now = {tool.name: tool for tool in listing.tools}
        events = changes(self.seen, now)
        self.seen = now
        if initial:
            self.output.start(events)
            if not events:
                _say(
                    f"no tools in workspace {self.args.workspace or 'default'!r} yet; watching for them (Ctrl-C to"
                    " stop)"
                )
        else:
            self.output.show(events)
        if listing.held != self.held:
            _say(held_notice(listing.held) if listing.held else "self-preservation holds no removal any more")
            self.held = list(listing.held)

    async def follow(self, client: RegistryClient) -> None:
        """Ask every `interval` seconds (from the start of one question to the next) until cancelled."""
        loop = asyncio.get_running_loop()
        client.timeout = self.args.timeout
        due = loop.time()
        while True:
            due = max(due + self.interval, loop.time())  # a slow answer does not bring a burst of catch-up questions
            await asyncio.sleep(due - loop.time())
            try:
                listing = await client.list(self.args.workspace)
            except (RegistryUnavailable, TransportError) as exc:
                if not self.lost:
                    self.lost = True
                    why = (
                        f"no answer within {self.args.timeout:g}s"
                        if isinstance(exc, RegistryUnavailable)
                        else _first_line(exc)
                    )
                    _say(
                        f"the registry stopped answering ({why}); still watching, and asking again until it answers"
                        " (Ctrl-C to stop)"
                    )
                continue
            if self.lost:
                self.lost = False
                _say("the registry answers again; the rows below are what changed meanwhile")
            self.update(listing)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


async def watch_tools(args: argparse.Namespace) -> int:
    """`toolreg tools --watch`: the first listing fails like `toolreg tools` (exit 1); after it, only Ctrl-C or SIGTERM
    ends it (exit 0)."""
    if output_format(args) not in ("table", "json") or getattr(args, "no_headers", False):
        raise CommandError("--watch prints a table (with its header) or one JSON object per change (-o json)")
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    stopping = False

    def stop() -> None:
        nonlocal stopping
        stopping = True
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    try:
        async with registry_client(args) as client:
            with answering(args):
                first = await client.list(args.workspace)
            await Watch(args, first).follow(client)
    except asyncio.CancelledError:
        if not stopping:
            raise
        task.uncancel()  # asked to stop: the command's normal end, not a cancellation
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return 0

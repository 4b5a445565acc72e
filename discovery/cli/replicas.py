"""`toolreg replicas [--json]`: the replica groups of a topicspace, as their members describe themselves.

Every replica (`toolreg up --store pulsar`) publishes its status once a
second on the topicspace's members topic; this listens for a few of those
seconds and prints what it heard: id, group, role, pid, host, the version it
has applied and since when it holds its role.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from .common import CommandError, lazy, settings_of

if TYPE_CHECKING:
    from discovery.replicas.membership import ReplicaStatus

LISTEN = 2.5
"""Seconds to listen: a member publishes every second, so every live one is heard at least twice."""


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    replicas = sub.add_parser(
        "replicas",
        parents=[common],
        help="list the replicas of the replicated store and registry (--store pulsar)",
        description=(
            "List every replica heard on the topicspace: id, group, role (active or standby), pid, host, version"
            " applied, since."
        ),
    )
    replicas.add_argument("--json", action="store_true", help="print JSON: one object per replica")
    replicas.add_argument(
        "--listen", type=float, default=LISTEN, metavar="SECONDS", help=f"how long to listen (default {LISTEN:g})"
    )
    replicas.set_defaults(handler=lazy("replicas", "cmd_replicas"))


async def cmd_replicas(args: argparse.Namespace) -> int:
    from discovery.replicas.membership import ReplicaStatus
    from toolservice_base import Envelope, open_transport

    heard: dict[tuple[str, str], ReplicaStatus] = {}

    async def on_status(envelope: Envelope) -> None:
        status = ReplicaStatus.from_wire(envelope.data, time.monotonic())
        if status is not None:
            heard[(status.group, status.id)] = status

    async with AsyncExitStack() as stack:
        connection = await open_transport(settings_of(args))
        stack.push_async_callback(connection.close)
        subscription = await connection.subscribe(connection.topics.state_members, on_status)
        stack.push_async_callback(connection.unsubscribe, subscription)
        await asyncio.sleep(max(args.listen, 0.1))
    statuses = sorted(heard.values(), key=lambda s: (s.group, s.role != "active", s.id))
    if args.json:
        print(json.dumps([_row(status) for status in statuses], indent=2))
        return 0
    if not statuses:
        raise CommandError(
            f"no replica heard on {connection.topics.state_members} within {args.listen:g}s; "
            "replicas run with `toolreg up --store pulsar` on the same broker and topicspace"
        )
    rows = [[s.group, s.id, s.role, str(s.pid), s.host, str(s.version), _since(s.since)] for s in statuses]
    headers = ["GROUP", "ID", "ROLE", "PID", "HOST", "VERSION", "SINCE"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for line in [headers, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    return 0


def _row(status: ReplicaStatus) -> dict[str, Any]:
    return {
        "id": status.id,
        "group": status.group,
        "role": status.role,
        "pid": status.pid,
        "host": status.host,
        "version": status.version,
        "since": status.since,
        "term": status.term,
    }


def _since(at: float) -> str:
    seconds = max(0.0, time.time() - at)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"

"""`toolreg replicas [--json]`: the replica groups of a topicspace, as their members describe themselves.

Every replica (`toolreg up --store pulsar`) publishes its status once a
second on the topicspace's members topic; this listens for a few of those
seconds and prints what it heard: id, group, role, pid, host, the version it
has applied and since when it holds its role.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from .common import CommandError, Deadline, connect, lazy, opened
from .output import Column, add_output_options, output_format, render

if TYPE_CHECKING:
    from discovery.replicas.membership import ReplicaStatus

LISTEN = 2.5
"""Seconds to listen: a member publishes every second, so every live one is heard at least twice."""
TIMEOUT = 5.0
"""Seconds `--timeout` gives reaching the broker and subscribing, as the other commands that ask (`toolreg tools`)."""


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
    replicas.add_argument("--json", action="store_true", help="print JSON: one object per replica (-o json)")
    add_output_options(replicas, wide="TERM and the SETTINGS digest", name="replica id")
    replicas.add_argument(
        "--listen", type=float, default=LISTEN, metavar="SECONDS", help=f"how long to listen (default {LISTEN:g})"
    )
    replicas.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT,
        metavar="SECONDS",
        help=f"the longest to wait for the broker before listening (default {TIMEOUT:g})",
    )
    replicas.set_defaults(handler=lazy("replicas", "cmd_replicas"))


async def cmd_replicas(args: argparse.Namespace) -> int:
    from discovery.replicas.membership import ReplicaStatus
    from toolservice_base import Envelope

    heard: dict[tuple[str, str], ReplicaStatus] = {}

    async def on_status(envelope: Envelope) -> None:
        status = ReplicaStatus.from_wire(envelope.data, time.monotonic())
        if status is not None:
            heard[(status.group, status.id)] = status

    chosen = output_format(args)
    deadline = Deadline(args.timeout)
    async with AsyncExitStack() as stack:
        connection = await connect(args, deadline)
        stack.push_async_callback(connection.close)
        topic = connection.topics.state_members

        async def listen() -> None:
            subscription = await connection.subscribe(topic, on_status)
            stack.push_async_callback(connection.unsubscribe, subscription)

        await opened(listen(), connection.url, topic, deadline)
        await asyncio.sleep(max(args.listen, 0.1))
    statuses = sorted(heard.values(), key=lambda s: (s.group, s.role != "active", s.id))
    if not statuses and chosen not in ("json", "yaml"):
        raise CommandError(
            f"no replica heard on {topic} within {args.listen:g}s; "
            "replicas run with `toolreg up --store pulsar` on the same broker and topicspace"
        )
    render(args, statuses, COLUMNS, name=lambda s: s.id, record=_row, empty="")
    return 0


COLUMNS: list[Column[ReplicaStatus]] = [
    Column("GROUP", lambda s: s.group),
    Column("ID", lambda s: s.id),
    Column("ROLE", lambda s: s.role),
    Column("PID", lambda s: str(s.pid)),
    Column("HOST", lambda s: s.host),
    Column("VERSION", lambda s: str(s.version)),
    Column("TERM", lambda s: str(s.term), wide=True),
    Column("SETTINGS", lambda s: s.settings or "-", wide=True),
    Column("SINCE", lambda s: _since(s.since)),
]


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
        "settings": status.settings,
    }


def _since(at: float) -> str:
    seconds = max(0.0, time.time() - at)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"

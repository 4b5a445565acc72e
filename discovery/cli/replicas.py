"""`toolreg replicas [--json]` and `toolreg group-key new|rotate PATH`: the replica groups of a topicspace.

Every replica (`toolreg up --store pulsar`) publishes its status once a
second on the topicspace's members topic; `replicas` listens for a few of
those seconds and prints what it heard: id, group, role, pid, host, the
version it has applied and since when it holds its role. A status is a
claim, so it also reads each group's lock and says which replica holds it
(LOCK): a status claiming to be active that does not hold the lock is a
stale one, or a forgery. With the group key (TOOLREG_GROUP_KEY) it lists only
statuses signed with it, and says how many others it heard.

`group-key` makes and rotates the key the replicas sign their state records
with (`discovery.replicas.groupkey`).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import CommandError, Deadline, connect, lazy, opened
from .output import Column, add_output_options, output_format, render

if TYPE_CHECKING:
    from discovery.replicas.status import ReplicaStatus
    from toolservice_base.transport import Transport

LISTEN = 2.5
"""Seconds to listen: a member publishes every second, so every live one is heard at least twice."""
TIMEOUT = 5.0
"""Seconds `--timeout` gives reaching the broker and subscribing, as the other commands that ask (`toolreg tools`)."""
LOCKS = {"config-store": "state_lock", "registry": "registry_lock"}
"""Each group's lock, as a `Topics` attribute."""


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    _add_replicas_command(sub, common)
    _add_group_key_command(sub, common)


def _add_replicas_command(sub: Any, common: argparse.ArgumentParser) -> None:
    replicas = sub.add_parser(
        "replicas",
        parents=[common],
        help="list the replicas of the replicated store and registry (--store pulsar)",
        description=(
            "List every replica heard on the topicspace: id, group, role (active or standby), whether it holds its"
            " group's lock, pid, host, version applied, since."
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


def _add_group_key_command(sub: Any, common: argparse.ArgumentParser) -> None:
    group_key = sub.add_parser(
        "group-key",
        parents=[common],
        help="make or rotate the replicas' group key (TOOLREG_GROUP_KEY)",
        description=(
            "The group key signs every record the replicas write on the state topics; a record without a valid"
            " signature is refused. Give every replica of the topicspace the same file (TOOLREG_GROUP_KEY), and"
            " nobody else."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  toolreg group-key new /etc/toolreg/group.key\n"
            "  TOOLREG_GROUP_KEY=/etc/toolreg/group.key TOOLREG_STORE=pulsar toolreg up\n"
            "  toolreg group-key rotate /etc/toolreg/group.key    # three times, restarting every replica after each\n"
        ),
    )
    actions = group_key.add_subparsers(dest="group_key_command", metavar="ACTION", required=True)
    new = actions.add_parser(
        "new", parents=[common], help="write a new key file (mode 0600)", description="Write a new group key file."
    )
    new.add_argument("path", metavar="PATH")
    new.set_defaults(handler=lazy("replicas", "cmd_group_key_new"))
    rotate = actions.add_parser(
        "rotate",
        parents=[common],
        help="take the next step of a rotation (run three times)",
        description=(
            "Step 1 adds a new key (accepted, not signing), step 2 signs with it, step 3 drops the old one. After each"
            " step restart every replica with the file, one at a time: at every step each accepts what the others"
            " sign with."
        ),
    )
    rotate.add_argument("path", metavar="PATH")
    rotate.set_defaults(handler=lazy("replicas", "cmd_group_key_rotate"))


async def cmd_group_key_new(args: argparse.Namespace) -> int:
    from discovery.replicas import GroupKey

    key = GroupKey.generate()
    path = key.save(Path(args.path), new=True)
    print(f"group key {key.signing} written to {path} (mode 0600)")
    print(f"give it to every replica, and nobody else: TOOLREG_GROUP_KEY={path} toolreg up --store pulsar")
    return 0


async def cmd_group_key_rotate(args: argparse.Namespace) -> int:
    from discovery.replicas import GroupKey

    path = Path(args.path)
    key, said = GroupKey.load(path).rotated()
    key.save(path)
    print(f"{path}: {said}")
    return 0


async def cmd_replicas(args: argparse.Namespace) -> int:
    from discovery.replicas import group_key_from
    from discovery.replicas.records import RecordCheck
    from discovery.replicas.settings import ReplicaSettings
    from discovery.replicas.status import STATUS_KIND, ReplicaStatus
    from toolservice_base import Envelope

    key = group_key_from(ReplicaSettings.from_env().group_key_file)
    heard: dict[tuple[str, str], ReplicaStatus] = {}
    unsigned: set[str] = set()
    chosen = output_format(args)
    deadline = Deadline(args.timeout)
    async with AsyncExitStack() as stack:
        connection = await connect(args, deadline)
        stack.push_async_callback(connection.close)
        topic = connection.topics.state_members
        check = RecordCheck(topic, key)

        async def on_status(envelope: Envelope) -> None:
            status = ReplicaStatus.from_wire(envelope.data, time.monotonic())
            if status is None:
                return
            if check.forgery(envelope, STATUS_KIND) is not None:
                unsigned.add(status.id)
                return
            heard[(status.group, status.id)] = status

        async def listen() -> None:
            subscription = await connection.subscribe(topic, on_status)
            stack.push_async_callback(connection.unsubscribe, subscription)

        await opened(listen(), connection.url, topic, deadline)
        await asyncio.sleep(max(args.listen, 0.1))
        holders = await _holders(connection, {status.group for status in heard.values()}, key)
    statuses = sorted(heard.values(), key=lambda s: (s.group, s.role != "active", s.id))
    if not statuses and chosen not in ("json", "yaml"):
        raise CommandError(
            f"no replica heard on {topic} within {args.listen:g}s; "
            "replicas run with `toolreg up --store pulsar` on the same broker and topicspace"
            + (f" (and {len(unsigned)} status(es) not signed with the group key were ignored)" if unsigned else "")
        )
    render(
        args,
        statuses,
        _columns(holders),
        name=lambda s: s.id,
        record=lambda s: _row(s, holders),
        empty="",
    )
    if unsigned and chosen in ("table", "wide"):
        print(f"ignored {len(unsigned)} status(es) not signed with the group key: {', '.join(sorted(unsigned))}")
    return 0


def _columns(holders: dict[str, str | None]) -> list[Column[ReplicaStatus]]:
    return [
        Column("GROUP", lambda s: s.group),
        Column("ID", lambda s: s.id),
        Column("ROLE", lambda s: s.role),
        Column("LOCK", lambda s: _lock(s, holders)),
        Column("PID", lambda s: str(s.pid)),
        Column("HOST", lambda s: s.host),
        Column("VERSION", lambda s: str(s.version)),
        Column("TERM", lambda s: str(s.term), wide=True),
        Column("SETTINGS", lambda s: s.settings or "-", wide=True),
        Column("SINCE", lambda s: _since(s.since)),
    ]


async def _holders(connection: Transport, groups: set[str], key: Any) -> dict[str, str | None]:
    """Each group's lock holder, by the lock's last marker; None where the broker cannot say (pulsar-lite)."""
    from discovery.replicas.markers import lock_holder
    from toolservice_base.errors import TransportError

    found: dict[str, str | None] = {}
    if not connection.capabilities.replicated_state:
        return found
    for group in groups & set(LOCKS):
        try:
            holder = await lock_holder(connection, getattr(connection.topics, LOCKS[group]), key)
        except TransportError:
            continue
        found[group] = holder[0] if holder else None
    return found


def _holds(status: ReplicaStatus, holders: dict[str, str | None]) -> bool | None:
    if status.group not in holders:
        return None
    return holders[status.group] == status.id


def _lock(status: ReplicaStatus, holders: dict[str, str | None]) -> str:
    holds = _holds(status, holders)
    if holds is None:
        return "-"
    if holds:
        return "held"
    return "NOT HELD" if status.role == "active" else ""


def _row(status: ReplicaStatus, holders: dict[str, str | None]) -> dict[str, Any]:
    return {
        "id": status.id,
        "group": status.group,
        "role": status.role,
        "holds_lock": _holds(status, holders),
        "pid": status.pid,
        "host": status.host,
        "version": status.version,
        "since": status.since,
        "term": status.term,
        "settings": status.settings,
        "store": status.store or None,
    }


def _since(at: float) -> str:
    seconds = max(0.0, time.time() - at)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"

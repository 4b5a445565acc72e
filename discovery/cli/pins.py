"""`toolreg pending`, `approve`, `reject`: the operator's side of pinned definitions (`toolreg up --pin-definitions`).

The registry pins each announced tool's definition when it first accepts
it, and holds a later one that differs (`discovery.registry.pins`); these
commands list the held changes with their diffs and decide on them, through
the registry's query API.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from typing import Any

from discovery.registry.client import RegistryClient
from discovery.registry.protocol import PendingChange, RegistryRequest
from toolservice_base.signing import DECISION_DOMAIN, load_private_key, sign_config_request

from .common import CommandError, settings_of
from .output import Column, add_output_options, render
from .registry import SHORT, age, ask_registry, query_parent

_HEX = re.compile(r"^[0-9a-f]{8,64}$")


def add_commands(subparsers: Any, common_parent: argparse.ArgumentParser) -> None:
    """`pending`, `approve`, `reject` on the `toolreg` parser."""
    query = query_parent(common_parent)
    _add_pending_command(subparsers, query)
    _add_decision_commands(subparsers, query)


def _add_pending_command(subparsers: Any, query: argparse.ArgumentParser) -> None:
    pending = subparsers.add_parser(
        "pending",
        parents=[query],
        help="list held definition changes (with --pin-definitions) and their diffs",
        description=(
            "With --pin-definitions the registry pins each announced tool's definition (description, arguments, config"
            " values, its service's queues and params) when it first accepts it. A later announcement offering another"
            " definition is held: agents keep the pinned one. This lists the held changes, each with a diff."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  toolreg pending\n  toolreg pending --json | jq -r '.[] | .tool + \" \" + .offered'\n",
    )
    pending.add_argument("--json", action="store_true", help="print JSON instead of a table and diffs (-o json)")
    add_output_options(pending, wide="the whole digests and the pinned version", name="tool name")
    pending.add_argument("--workspace", default=None, help="only the changes in this workspace (default: all)")
    pending.set_defaults(handler=cmd_pending)


def _add_decision_commands(subparsers: Any, query: argparse.ArgumentParser) -> None:
    """`approve` and `reject`: the same arguments, one decision each."""
    for name, summary, effect in (
        (
            "approve",
            "pin the definition offered for TOOL: agents see it within a second",
            "Pin the held definition of TOOL: the registry writes it at once and agents reload it.",
        ),
        (
            "reject",
            "keep TOOL's pinned definition and refuse the one offered",
            (
                "Keep the pinned definition of TOOL; announcements offering the rejected one are refused from now on "
                "(`toolreg rejections`) and their senders told."
            ),
        ),
    ):
        command = subparsers.add_parser(
            name,
            parents=[query],
            help=summary,
            description=effect,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=(
                f"examples:\n  toolreg pending\n  toolreg {name} tell-joke --digest 3f2a9c1b4d5e\n"
                f"  toolreg {name} tell-joke --signing-key keys/alice.key   # under config-writes signed\n"
            ),
        )
        command.add_argument("tool", metavar="TOOL")
        command.add_argument(
            "--digest",
            default=None,
            metavar="D",
            help=(
                "only if the offered definition is this one (its digest, or 8+ leading hex digits, from `toolreg"
                " pending`)"
            ),
        )
        _add_decision_options(command)
        command.set_defaults(handler=cmd_approve if name == "approve" else cmd_reject)


def _add_decision_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--workspace", default=None, help="config workspace (default: the registry's, 'default')")
    command.add_argument(
        "--signing-key",
        default=None,
        metavar="KEY",
        help="an operator's private key to sign the decision with (required under config-writes signed)",
    )


def pending_columns(now: float) -> list[Column[PendingChange]]:
    return [
        Column("TOOL", lambda c: c.tool),
        Column("SERVICE", lambda c: c.service),
        Column("WORKSPACE", lambda c: c.workspace),
        Column("PINNED", lambda c: c.pinned[:SHORT], narrow=True),
        Column("OFFERED", lambda c: c.offered[:SHORT], narrow=True),
        Column("PINNED", lambda c: c.pinned, wide=True),
        Column("PINNED VERSION", lambda c: c.pinned_version or "-", wide=True),
        Column("OFFERED", lambda c: c.offered, wide=True),
        Column("VERSION", lambda c: c.version or "-"),
        Column("SIGNER", lambda c: c.signer or "-"),
        Column("FIRST SEEN", lambda c: age(now - c.first_seen)),
        Column("LAST SEEN", lambda c: age(now - c.last_seen)),
    ]


async def cmd_pending(args: argparse.Namespace) -> int:
    async def action(client: RegistryClient) -> int:
        found = await client.pending()
        changes = [c for c in found.changes if args.workspace is None or c.workspace == args.workspace]
        where = "" if args.workspace is None else f" in workspace {args.workspace!r}"
        off = "" if found.pinning else " (this registry does not pin definitions: start it with --pin-definitions)"
        chosen = render(
            args,
            changes,
            pending_columns(time.time()),
            name=lambda c: c.tool,
            record=lambda c: c.model_dump(mode="json"),
            empty=f"no pending definition changes{where}{off}",
        )
        if chosen in ("table", "wide"):  # each change's diff, and the commands that decide on it
            for change in changes:
                print()
                print(_decision_help(change))
                print(change.diff)
        return 0

    return await ask_registry(args, action)


def _decision_help(change: PendingChange) -> str:
    workspace = "" if change.workspace == "default" else f" --workspace {change.workspace}"
    return (
        f"# {change.tool} ({change.service}, workspace {change.workspace}): pinned {change.pinned[:SHORT]}, offered"
        f" {change.offered[:SHORT]}\n#   toolreg approve {change.tool} --digest {change.offered[:SHORT]}{workspace}   "
        f" or    toolreg reject {change.tool}{workspace}"
    )


def _signer(args: argparse.Namespace) -> Callable[[RegistryRequest], RegistryRequest] | None:
    """`--signing-key`: the decision signed by that operator key, for the topicspace it goes to."""
    if not args.signing_key:
        return None
    key, topicspace = load_private_key(args.signing_key), settings_of(args).topicspace
    return lambda request: sign_config_request(request, key, topicspace, domain=DECISION_DOMAIN)


def _digest_arg(args: argparse.Namespace) -> str | None:
    digest: str | None = args.digest
    if digest is None:
        return None
    digest = digest.strip().lower()
    if not _HEX.match(digest):
        raise CommandError(
            f"--digest {args.digest!r} is not a definition digest: 8 to 64 hex digits, as `toolreg pending` shows them"
        )
    return digest


async def cmd_approve(args: argparse.Namespace) -> int:
    digest = _digest_arg(args)

    async def action(client: RegistryClient) -> int:
        client.sign = _signer(args)
        decision = await client.approve(args.tool, args.workspace, digest)
        change = decision.change
        done = "agents see it now" if decision.applied else "it is being written to the store"
        print(f"approved {change.tool}: pinned {change.offered[:SHORT]} (was {change.pinned[:SHORT]}); {done}")
        return 0

    return await ask_registry(args, action)


async def cmd_reject(args: argparse.Namespace) -> int:
    digest = _digest_arg(args)

    async def action(client: RegistryClient) -> int:
        client.sign = _signer(args)
        change = (await client.reject(args.tool, args.workspace, digest)).change
        print(
            f"rejected {change.offered[:SHORT]} for {change.tool}: it stays pinned at {change.pinned[:SHORT]}; "
            f"announcements offering {change.offered[:SHORT]} are refused (`toolreg rejections`)"
        )
        return 0

    return await ask_registry(args, action)

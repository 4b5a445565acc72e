"""The registry's `toolreg` commands: `registry`, `tools`, `rejections`, `conflicts`, `release`.

Each handler is an `async def (args) -> int`. Anything a user can get wrong
(no broker, no registry, no store) ends as one line on stderr and exit
code 1; command output goes to stdout, logs to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any

from discovery.registry.client import DEFAULT_TIMEOUT, RegistryClient
from discovery.registry.options import RegistryOptions
from discovery.registry.trust import TRUST_POLICY_ENV, PolicyError, policy_from
from discovery.registry.validation import DEFAULT_MAX_SKEW
from toolservice_base import open_transport

from .common import CommandError, lazy, settings_of

ALLOWED_NAMESPACES_ENV = "TOOLREG_ALLOWED_NAMESPACES"
MAX_CLOCK_SKEW_ENV = "TOOLREG_MAX_CLOCK_SKEW"


def add_registry_options(parser: argparse.ArgumentParser) -> None:
    """The trust and bad-input options shared by `toolreg up` and `toolreg registry`."""
    parser.add_argument(
        "--trust-policy", default=None, metavar="PATH",
        help=f"accept only announcements signed by keys in this policy (env {TRUST_POLICY_ENV}; edit with `toolreg trust add`)",
    )
    parser.add_argument(
        "--allow-namespace", action="append", default=None, metavar="TENANT/NAMESPACE", dest="allow_namespace",
        help=f"a namespace announced queues may live in; repeat for more (env {ALLOWED_NAMESPACES_ENV}, comma-separated; "
        "default: the topicspace's request and response, e.g. tg/request tg/response)",
    )
    parser.add_argument(
        "--max-clock-skew", type=float, default=None, metavar="SECONDS",
        help=f"refuse announcements whose sent-at is further than this from the registry's clock (env {MAX_CLOCK_SKEW_ENV}; "
        f"default {DEFAULT_MAX_SKEW:g})",
    )


def registry_options(args: argparse.Namespace) -> RegistryOptions:
    """`RegistryOptions` from the flags, else the environment, else the defaults; a bad value is a `CommandError`."""
    try:
        trust = policy_from(getattr(args, "trust_policy", None))
    except PolicyError as exc:
        raise CommandError(str(exc)) from None
    namespaces = getattr(args, "allow_namespace", None)
    if not namespaces:
        from_env = os.environ.get(ALLOWED_NAMESPACES_ENV, "")
        namespaces = [item.strip() for item in from_env.split(",") if item.strip()] or list(
            settings_of(args).topics.queue_namespaces
        )
    skew = getattr(args, "max_clock_skew", None)
    if skew is None:
        text = os.environ.get(MAX_CLOCK_SKEW_ENV)
        try:
            skew = float(text) if text else DEFAULT_MAX_SKEW
        except ValueError:
            raise CommandError(f"{MAX_CLOCK_SKEW_ENV}={text!r} is not a number of seconds") from None
    try:
        return RegistryOptions(trust=trust, allowed_namespaces=tuple(namespaces), max_clock_skew=skew)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def trust_line(options: RegistryOptions) -> str:
    """What `toolreg up` and `toolreg registry` print about trust at start: never silent about accepting everyone."""
    namespaces = ", ".join(options.allowed_namespaces or ())
    trust = options.trust
    if trust is None:
        return f"no trust policy: every valid announcement is accepted, signed or not (--trust-policy PATH to require signatures); queues in {namespaces}"
    where = getattr(trust, "path", None)
    keys = len(getattr(trust, "keys", ()))
    return f"trust policy {where or '(in memory)'}: {keys} key(s); only their signed announcements are accepted; queues in {namespaces}"


async def _query(args: argparse.Namespace, action: Callable[[RegistryClient], Awaitable[int]]) -> int:
    async with AsyncExitStack() as stack:
        connection = await open_transport(settings_of(args))
        stack.push_async_callback(connection.close)
        client = RegistryClient(connection, timeout=args.timeout)
        stack.push_async_callback(client.close)
        await client.start()
        return await action(client)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [headers, *rows]]
    return "\n".join(lines)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _show(args: argparse.Namespace, items: Sequence[Any], empty: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> int:
    """`--json`: the items as a JSON list; otherwise a table, or `empty` when there is nothing."""
    if args.json:
        print(json.dumps([item.model_dump(mode="json") for item in items], indent=2))
    elif not items:
        print(empty)
    else:
        print(_table(headers, rows))
    return 0


async def cmd_tools(args: argparse.Namespace) -> int:
    async def action(client: RegistryClient) -> int:
        listing = await client.list(args.workspace)
        if listing.held:
            print(
                f"toolreg: self-preservation is holding the removal of {', '.join(listing.held)}: their leases ran out together; "
                "they come back if their heartbeats resume, or run `toolreg release` to remove them",
                file=sys.stderr,
            )
        rows = [
            (
                t.name, t.service or "-", t.source, t.status, str(t.instances) if t.source == "announced" else "-",
                _age(t.last_heartbeat_age), t.detail,
            )
            for t in listing.tools
        ]
        return _show(args, listing.tools, f"no tools in workspace {args.workspace or 'default'!r}",
                     ("TOOL", "SERVICE", "SOURCE", "STATUS", "INSTANCES", "LAST HEARTBEAT", "WHY"), rows)

    return await _query(args, action)


async def cmd_rejections(args: argparse.Namespace) -> int:
    async def action(client: RegistryClient) -> int:
        rejections = await client.rejections()
        now = time.time()
        rows = [
            (_age(now - r.at), str(r.count), _age(now - (r.first if r.first is not None else r.at)), r.service or "-", r.instance or "-", r.reason)
            for r in rejections
        ]
        return _show(args, rejections, "no rejected announcements", ("LAST", "COUNT", "FIRST", "SERVICE", "INSTANCE", "REASON"), rows)

    return await _query(args, action)


async def cmd_conflicts(args: argparse.Namespace) -> int:
    async def action(client: RegistryClient) -> int:
        conflicts = await client.conflicts()
        rows = [(c.tool, c.service, c.held_by, c.workspace, c.reason) for c in conflicts]
        return _show(args, conflicts, "no conflicts", ("TOOL", "REFUSED FOR", "HELD BY", "WORKSPACE", "REASON"), rows)

    return await _query(args, action)


async def cmd_release(args: argparse.Namespace) -> int:
    async def action(client: RegistryClient) -> int:
        released = await client.release()
        if released:
            print(f"released {len(released)} service(s): {', '.join(released)}; their tools are being removed")
        else:
            print("nothing is held; no deletions were waiting")
        return 0

    return await _query(args, action)


def add_commands(subparsers: Any, common_parent: argparse.ArgumentParser) -> None:
    """Register the registry's subcommands on the `toolreg` parser."""
    query = argparse.ArgumentParser(add_help=False, parents=[common_parent])
    query.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help=f"seconds to wait for the registry (default {DEFAULT_TIMEOUT:g})")

    registry = subparsers.add_parser(
        "registry", parents=[common_parent], help="run the registry alone (broker and config store already running)",
        description="Run the registry until SIGTERM or Ctrl-C: merge announced tool services into the config store "
        "and remove them when their leases run out. `toolreg up` runs one for you; use this to run it separately.",
    )
    add_registry_options(registry)
    registry.add_argument("--metrics-port", type=int, default=None,
                          help="serve /healthz, /readyz and /metrics on this port (env TOOLREG_METRICS_PORT; default off)")
    registry.set_defaults(handler=lazy("up", "cmd_registry"))

    tools = subparsers.add_parser(
        "tools", parents=[query], help="list tools: announced and static, with status and instances",
        description="List the tools of a workspace: the announced ones the registry merged (with their service, "
        "status, instance count and last heartbeat) and the static ones written by hand.",
    )
    tools.add_argument("--json", action="store_true", help="print a JSON list of objects instead of a table")
    tools.add_argument("--workspace", default=None, help="config workspace (default: the registry's, 'default')")
    tools.set_defaults(handler=cmd_tools)

    rejections = subparsers.add_parser(
        "rejections", parents=[query], help="list recently rejected announcements and why",
        description="List the most recent announcements the registry refused (malformed, too large, stale, replayed, bad queues, "
        "untrusted, tool names taken), one row per sender and reason with how often and since when.",
    )
    rejections.add_argument("--json", action="store_true", help="print JSON instead of a table")
    rejections.set_defaults(handler=cmd_rejections)

    conflicts = subparsers.add_parser(
        "conflicts", parents=[query], help="list announced tools refused because the name is taken",
        description="List announced tools the registry refused because a static item or an earlier service holds the name.",
    )
    conflicts.add_argument("--json", action="store_true", help="print JSON instead of a table")
    conflicts.set_defaults(handler=cmd_conflicts)

    release = subparsers.add_parser(
        "release", parents=[query], help="confirm the removals self-preservation is holding",
        description="When many leases run out at once the registry holds their removal (self-preservation). "
        "Run this to confirm those services are gone and remove their tools now.",
    )
    release.set_defaults(handler=cmd_release)

"""The registry's `toolreg` commands: `registry`, `tools`, `rejections`, `conflicts`, `release`,
and for pinned definitions `pending`, `approve`, `reject`.

Each handler is an `async def (args) -> int`. Anything a user can get wrong
(no broker, no registry, no store) ends as one line on stderr and exit
code 1; command output goes to stdout, logs to stderr. `toolreg tools
--strict` exits `HELD_EXIT` while self-preservation holds a removal, so a
script can tell "the registry is holding" from "the registry is not there".
"""

from __future__ import annotations

import argparse
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from discovery.errors import RegistryUnavailable
from discovery.mcp.settings import McpSettings
from discovery.registry.client import DEFAULT_TIMEOUT, RegistryClient
from discovery.registry.options import RegistryOptions
from discovery.registry.protocol import NameConflict, Rejection
from discovery.registry.settings import RegistrySettings
from discovery.registry.trust import PolicyError, TrustPolicy, policy_from
from discovery.registry.validation import DEFAULT_MAX_SKEW
from toolservice_base.errors import SettingsError
from toolservice_base.search.settings import SearchSettings

from .common import CommandError, Deadline, connect, lazy, opened, settings_of, waiting_for
from .output import Column, add_output_options, render
from .parsing import parent

if TYPE_CHECKING:
    from discovery.replicas import GroupKey
    from discovery.store.write_policy import ConfigWriteGuard

TRUST_POLICY_ENV = RegistrySettings.env("trust_policy")
ALLOWED_NAMESPACES_ENV = RegistrySettings.env("allowed_namespaces")
MAX_CLOCK_SKEW_ENV = RegistrySettings.env("max_clock_skew")
MAX_INSTANCES_ENV = RegistrySettings.env("max_instances")
PIN_DEFINITIONS_ENV = RegistrySettings.env("pin_definitions")

SHORT = 12
"""Hex digits of a definition digest shown in tables; `--digest` takes 8 or more."""
HELD_EXIT = 3
"""`toolreg tools --strict`: the exit code while self-preservation holds any removal (1 is for errors)."""
MIN_INTERVAL = 0.1
"""The shortest `toolreg tools --watch --interval`: each poll is a query the registry answers."""
_HEX = re.compile(r"^[0-9a-f]{8,64}$")


def add_registry_options(parser: argparse.ArgumentParser) -> None:
    """The trust and bad-input options shared by `toolreg up` and `toolreg registry`."""
    parser.add_argument(
        "--trust-policy",
        default=None,
        metavar="PATH",
        help=(
            f"accept only announcements signed by keys in this policy (env {TRUST_POLICY_ENV}; edit with `toolreg trust"
            " add`)"
        ),
    )
    parser.add_argument(
        "--allow-namespace",
        action="append",
        default=None,
        metavar="TENANT/NAMESPACE",
        dest="allow_namespace",
        help=(
            f"a namespace announced queues may live in; repeat for more (env {ALLOWED_NAMESPACES_ENV}, comma-separated;"
            " default: the topicspace's request and response, e.g. tg/request tg/response)"
        ),
    )
    parser.add_argument(
        "--max-clock-skew",
        type=float,
        default=None,
        metavar="SECONDS",
        help=(
            "refuse announcements whose sent-at is further than this from the registry's clock (env"
            f" {MAX_CLOCK_SKEW_ENV}; default {DEFAULT_MAX_SKEW:g})"
        ),
    )
    parser.add_argument(
        "--max-instances",
        type=int,
        default=None,
        metavar="N",
        help=(
            "instance leases the registry holds at once, all services together; a new instance past it is refused"
            f" (capacity) so a flood of made-up ids stops there (env {MAX_INSTANCES_ENV}; default"
            f" {RegistryOptions.max_instances:,})"
        ),
    )
    parser.add_argument(
        "--pin-definitions",
        action="store_true",
        default=None,
        help="pin each announced tool's definition when first accepted; a changed definition is held until "
        f'`toolreg approve` (env {PIN_DEFINITIONS_ENV}=1, or "pin-definitions": true in the trust policy)',
    )


def registry_options(args: argparse.Namespace) -> RegistryOptions:
    """`RegistryOptions` from the flags, else the environment (`RegistrySettings`), else the defaults; a bad value is
    a `CommandError`."""
    try:
        settings = settings_of(args)
        env = RegistrySettings.from_env()
        search = SearchSettings.from_env()
        follow_audit: bool = McpSettings.variable("audit_topic").read()  # the fronts' setting: do they publish?
    except SettingsError as exc:
        raise CommandError(str(exc)) from None
    try:
        trust = policy_from(getattr(args, "trust_policy", None) or env.trust_policy)
    except PolicyError as exc:
        raise CommandError(str(exc)) from None
    namespaces = getattr(args, "allow_namespace", None) or env.allowed_namespaces or settings.topics.queue_namespaces
    skew = getattr(args, "max_clock_skew", None)
    if skew is None:
        skew = env.max_clock_skew
    max_instances = getattr(args, "max_instances", None)
    if max_instances is None:
        max_instances = env.max_instances
    if max_instances < 1:
        raise CommandError(f"--max-instances must be at least 1, got {max_instances}")
    pin = bool(getattr(args, "pin_definitions", None)) or env.pin_definitions
    try:
        return RegistryOptions(
            trust=trust,
            allowed_namespaces=tuple(namespaces),
            max_clock_skew=skew,
            max_instances=max_instances,
            max_instances_per_service=min(RegistryOptions.max_instances_per_service, max_instances),
            pin_definitions=pin or (trust is not None and trust.pin_definitions),
            auto_approve=trust.auto_approve if trust is not None else None,
            follow_audit=follow_audit,
            audit_fronts=trust.front_keys() if trust is not None else {},
            search_embedder=search.embedder,
            search_embedder_key=search.embedder_key,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def trust_line(options: RegistryOptions) -> str:
    """What `toolreg up` and `toolreg registry` print about trust at start: never silent about accepting everyone."""
    namespaces = ", ".join(options.allowed_namespaces or ())
    trust = options.trust
    if trust is None:
        return (
            "no trust policy: every valid announcement is accepted, signed or not (--trust-policy PATH to require"
            f" signatures); queues in {namespaces}{_pinning_note(options)}{_audit_note(options)}"
        )
    where = trust.path
    keys = len(trust.keys)
    line = (
        f"trust policy {where or '(in memory)'}: {keys} key(s); only their signed announcements are accepted; queues in"
        f" {namespaces}"
    )
    return line + _pinning_note(options) + _config_writes_note(trust) + _audit_note(options)


def _audit_note(options: RegistryOptions) -> str:
    """Whose audit records the page's callers are counted from, when it follows the audit topic."""
    if not options.follow_audit:
        return ""
    if not options.audit_fronts:
        return (
            "; no audit front trusted: every audit record is counted as unverified, none as a caller (`toolreg trust"
            " add-front`)"
        )
    return f"; callers counted from the signed audit records of {len(options.audit_fronts)} front(s)"


def _config_writes_note(trust: object) -> str:
    if isinstance(trust, TrustPolicy) and trust.config_writes == "signed":
        return (
            f"; config writes of tools taken only when signed by one of {len(trust.operators)} operator key(s) (or"
            " the registry)"
        )
    return (
        "; the policy covers announcements only: whoever may send on the config queue can write tool items (add"
        ' "config-writes": "signed" with operator keys: `toolreg trust add-operator`)'
    )


def write_guard(options: RegistryOptions, key: GroupKey | None, topicspace: str) -> ConfigWriteGuard | None:
    """The store's guard on writes of tools, when the trust policy covers the config queue; else None."""
    trust = options.trust
    if not isinstance(trust, TrustPolicy) or trust.config_writes != "signed":
        return None
    from discovery.store.write_policy import ConfigWriteGuard

    return ConfigWriteGuard(
        operators={kid: k.public_key for kid, k in trust.operators.items()},
        names={kid: k.name for kid, k in trust.operators.items()},
        topicspace=topicspace,
        registry=key,
    )


def _pinning_note(options: RegistryOptions) -> str:
    if not options.pin_definitions:
        return ""
    auto = f"; auto-approve {options.auto_approve}" if options.auto_approve else ""
    return f"; definitions pinned: a changed one waits for `toolreg approve`{auto}"


@contextlib.asynccontextmanager
async def registry_client(args: argparse.Namespace) -> AsyncIterator[RegistryClient]:
    """A started registry client; `--timeout` bounds connecting to the broker and its first answer together
    (its `timeout` is what is left of it: set it again for later questions)."""
    deadline = Deadline(args.timeout)
    async with AsyncExitStack() as stack:
        connection = await connect(args, deadline)
        stack.push_async_callback(connection.close)
        client = RegistryClient(connection, timeout=args.timeout)
        stack.push_async_callback(client.close)
        await opened(client.start(), connection.url, "the registry's queues", deadline)
        client.timeout = deadline.left(floor=min(1.0, args.timeout))
        yield client


@contextlib.contextmanager
def answering(args: argparse.Namespace) -> Iterator[None]:
    """Around a command's question: say on a terminal what it waits for, and fail in one line saying what to run."""
    try:
        with waiting_for("the registry to answer (is `toolreg up` or `toolreg registry` running?)"):
            yield
    except RegistryUnavailable:
        raise RegistryUnavailable(
            f"the registry did not answer within {args.timeout:g}s; run `toolreg up` or `toolreg registry`"
        ) from None


async def ask_registry(args: argparse.Namespace, action: Callable[[RegistryClient], Awaitable[int]]) -> int:
    """Run `action` on a registry client; `--timeout` bounds it all, connecting to the broker included."""
    async with registry_client(args) as client:
        with answering(args):
            return await action(client)


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def record(item: BaseModel) -> Any:
    """A row of `-o json|yaml`: every field of the registry's answer, as it sent it."""
    return item.model_dump(mode="json")


def rejection_columns(now: float) -> list[Column[Rejection]]:
    return [
        Column("LAST", lambda r: age(now - r.at)),
        Column("COUNT", lambda r: str(r.count)),
        Column("FIRST", lambda r: age(now - (r.first if r.first is not None else r.at))),
        Column("SERVICE", lambda r: r.service or "-"),
        Column("INSTANCE", lambda r: r.instance or "-"),
        Column("WORKSPACE", lambda r: r.workspace or "-"),
        Column("EXCERPT", lambda r: " ".join(r.excerpt.split())[:60] or "-", wide=True),
        Column("REASON", lambda r: r.reason),
    ]


async def cmd_rejections(args: argparse.Namespace) -> int:
    async def action(client: RegistryClient) -> int:
        rejections = [r for r in await client.rejections() if args.workspace is None or r.workspace == args.workspace]
        empty = "no rejected announcements" + ("" if args.workspace is None else f" in workspace {args.workspace!r}")
        columns = rejection_columns(time.time())
        render(args, rejections, columns, name=lambda r: r.instance or r.service or "-", record=record, empty=empty)
        return 0

    return await ask_registry(args, action)


CONFLICT_COLUMNS: list[Column[NameConflict]] = [
    Column("TOOL", lambda c: c.tool),
    Column("REFUSED FOR", lambda c: c.service),
    Column("HELD BY", lambda c: c.held_by),
    Column("WORKSPACE", lambda c: c.workspace),
    Column("SINCE", lambda c: age(time.time() - c.at), wide=True),
    Column("REASON", lambda c: c.reason),
]


async def cmd_conflicts(args: argparse.Namespace) -> int:
    async def action(client: RegistryClient) -> int:
        conflicts = [c for c in await client.conflicts() if args.workspace is None or c.workspace == args.workspace]
        empty = "no conflicts" if args.workspace is None else f"no conflicts in workspace {args.workspace!r}"
        render(args, conflicts, CONFLICT_COLUMNS, name=lambda c: c.tool, record=record, empty=empty)
        return 0

    return await ask_registry(args, action)


async def cmd_release(args: argparse.Namespace) -> int:
    async def action(client: RegistryClient) -> int:
        released = await client.release()
        if released:
            print(f"released {len(released)} service(s): {', '.join(released)}; their tools are being removed")
        else:
            print("nothing is held; no deletions were waiting")
        return 0

    return await ask_registry(args, action)


def _interval(text: str) -> float:
    """`--interval`: seconds, at least `MIN_INTERVAL`; anything else is a usage error (exit 2)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds >= MIN_INTERVAL:
        raise argparse.ArgumentTypeError(f"{text} is too short: at least {MIN_INTERVAL:g} seconds")
    return seconds


def add_commands(subparsers: Any, common_parent: argparse.ArgumentParser) -> None:
    """Register the registry's subcommands on the `toolreg` parser (`pins` adds those of pinned definitions)."""
    query = query_parent(common_parent)
    _add_registry_command(subparsers, common_parent)
    _add_tools_command(subparsers, query)
    _add_report_commands(subparsers, query)
    _add_release_command(subparsers, query)


def query_parent(common_parent: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of every command that asks the registry: the common ones and `--timeout`."""
    query = parent(common_parent)
    query.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"the longest to wait for the broker and the registry's answer together (default {DEFAULT_TIMEOUT:g})",
    )
    return query


def _add_search_options(tools: argparse.ArgumentParser, once: argparse._MutuallyExclusiveGroup) -> None:
    """`toolreg tools --search QUERY [--limit N]` (`tool_search`)."""
    once.add_argument(
        "--search",
        default=None,
        metavar="QUERY",
        help=(
            "the tools that best match QUERY, best first, as an agent's search ranks them: by their names, titles,"
            " descriptions and arguments, then by health (held and unavailable tools left out, failing ones lower)"
        ),
    )
    tools.add_argument(
        "--limit",
        type=int,
        default=10,
        metavar="N",
        help="with --search: how many tools to show (1 to 100, default 10)",
    )


def _add_tools_command(subparsers: Any, query: argparse.ArgumentParser) -> None:
    """`toolreg tools`: the listing, `--strict` and `--watch`."""
    tools = subparsers.add_parser(
        "tools",
        parents=[query],
        help="list tools: announced and static, with status and instances",
        description=(
            "List the tools of a workspace: the announced ones the registry merged (with their service, "
            "status, instance count and last heartbeat) and the static ones written by hand. "
            "WHY says why a tool is not plainly live or configured; agents skip an `unavailable` one. "
            "While self-preservation holds removals, a line on stderr says which (`toolreg release`)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  toolreg tools\n  toolreg tools --workspace research --json\n"
        '  toolreg tools --json | jq -r \'.[] | select(.status == "unavailable") | .name + ": " + .detail\'\n'
        f'  toolreg tools --strict >/dev/null || echo "held ({HELD_EXIT}) or no registry (1)"\n'
        "  toolreg tools --watch                     # then a timestamped row per change, until Ctrl-C\n"
        "  toolreg tools --watch --json | jq -c 'select(.type == \"DELETED\") | .object.name'\n"
        "  toolreg tools --search 'open a ticket in jira' --limit 5\n",
    )
    tools.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list of objects instead of a table (-o json); with --watch, one JSON object per change",
    )
    add_output_options(tools, wide="WORKSPACE, VERSION and the whole DIGEST", name="tool name")
    tools.add_argument("--workspace", default=None, help="config workspace (default: the registry's, 'default')")
    once = tools.add_mutually_exclusive_group()
    once.add_argument(
        "--strict",
        action="store_true",
        help=(
            f"exit with code {HELD_EXIT} (after the listing) while self-preservation holds any removal; 1 stays for"
            " errors"
        ),
    )
    once.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help=(
            "keep watching: the listing, then a row for each tool that comes, changes (status, instances, WHY,"
            " definition) or goes, each with its time and ADDED/MODIFIED/DELETED, until Ctrl-C (exit 0). If the"
            " registry stops answering, one line on stderr says so and the watch keeps asking; another says when it is"
            " back"
        ),
    )
    _add_search_options(tools, once)
    tools.add_argument(
        "--interval",
        type=_interval,
        default=None,
        metavar="SECONDS",
        help=f"with --watch: how often to ask the registry (default 1, at least {MIN_INTERVAL:g})",
    )
    tools.set_defaults(handler=lazy("tools", "cmd_tools"))


def _add_report_commands(subparsers: Any, query: argparse.ArgumentParser) -> None:
    """`rejections`, `conflicts`: what the registry refused, and why."""
    rejections = subparsers.add_parser(
        "rejections",
        parents=[query],
        help="list recently rejected announcements and why",
        description=(
            "List the most recent announcements the registry refused (malformed, too large, stale, replayed, bad"
            " queues, untrusted, tool names taken), one row per sender and reason with how often and since when."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n  toolreg rejections\n  toolreg rejections --workspace research\n  toolreg rejections --json |"
            " jq '.[0].excerpt'\n"
        ),
    )
    rejections.add_argument("--json", action="store_true", help="print JSON instead of a table (-o json)")
    add_output_options(rejections, wide="an EXCERPT of what was refused", name="refused instance (or service)")
    rejections.add_argument(
        "--workspace",
        default=None,
        help=(
            "only the rejections of messages naming this workspace (default: all; "
            "a message too malformed to name one has none, shown as -)"
        ),
    )
    rejections.set_defaults(handler=cmd_rejections)

    conflicts = subparsers.add_parser(
        "conflicts",
        parents=[query],
        help="list announced tools refused because the name is taken",
        description=(
            "List announced tools the registry refused because a static item or an earlier service holds the name."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  toolreg conflicts\n  toolreg conflicts --workspace research --json\n",
    )
    conflicts.add_argument("--json", action="store_true", help="print JSON instead of a table (-o json)")
    add_output_options(conflicts, wide="SINCE when", name="tool name")
    conflicts.add_argument("--workspace", default=None, help="only the conflicts in this workspace (default: all)")
    conflicts.set_defaults(handler=cmd_conflicts)


def _add_release_command(subparsers: Any, query: argparse.ArgumentParser) -> None:
    """`release`: confirm the removals self-preservation holds."""
    release = subparsers.add_parser(
        "release",
        parents=[query],
        help="confirm the removals self-preservation is holding",
        description=(
            "When many leases run out at once the registry holds their removal (self-preservation). "
            "Run this to confirm those services are gone and remove their tools now."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  toolreg tools      # the held services are named on stderr\n  toolreg release\n",
    )
    release.set_defaults(handler=cmd_release)


def _add_registry_command(subparsers: Any, common_parent: argparse.ArgumentParser) -> None:
    """`toolreg registry`: the registry run on its own (beside TrustGraph's config service, say)."""
    registry = subparsers.add_parser(
        "registry",
        parents=[common_parent],
        help="run the registry alone (broker and config store already running)",
        description=(
            "Run the registry until SIGTERM or Ctrl-C: merge announced tool services into the config store "
            "and remove them when their leases run out. `toolreg up` runs one for you; use this to run it separately."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n  PULSAR_URL=pulsar://broker:6650 toolreg registry --trust-policy trust.json --metrics-port"
            " 9464\n"
        ),
    )
    add_registry_options(registry)
    registry.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /healthz, /readyz and /metrics on this port (env TOOLREG_METRICS_PORT; default off)",
    )
    registry.set_defaults(handler=lazy("up", "cmd_registry"))

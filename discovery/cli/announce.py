"""`toolreg announce`: make a running tool service discoverable without changing it (a sidecar).

A service not built on our `DynamicToolService` (a stock TrustGraph
`DynamicToolService`, say) cannot announce itself. The sidecar runs beside
it and does it on its behalf, with the same machinery a service uses
(`toolservice_base.announcer`): one `announce` at start and on every probe,
heartbeats every ttl/3 while the sidecar lives, a `withdraw` on SIGTERM or
Ctrl-C. The descriptors go through the same validation as `toolreg serve`'s
(`build_descriptors`), are signed with the same key option, and meet the
same trust policy at the registry.

The sidecar vouches only for the descriptors, not for the service: run it
in the same unit as the service (a second container in the pod, a second
process in the same systemd unit) so it dies when the service does.
"""

from __future__ import annotations

import argparse
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from toolservice_base.announcer import Announcer
from toolservice_base.declaration import build_descriptors
from toolservice_base.errors import ServiceDefinitionError
from toolservice_base.schemas import DEFAULT_TTL, MAX_VERSION, check_name
from toolservice_base.signing import load_private_key
from toolservice_base.topics import DEFAULT as DEFAULT_TOPICS
from toolservice_base.topics import Topics
from toolservice_base.transport import open_transport

from .announce_mcp import add_mcp_options, cmd_announce_mcp
from .common import CommandError, settings_of, wait_for_signal

MAX_TTL = 3600.0
"""The longest lease an announcement may ask for (the `Announcement` model's bound)."""
MIN_TTL = 1.0
"""The shortest lease `--ttl` takes: heartbeats go every ttl/3, so less would mean several messages a second from
every instance, and a lease that a garbage-collection pause or a broker hiccup ends."""


def check_ttl(ttl: float, option: str = "--ttl") -> float:
    """`ttl` if it is a lease length the registry takes and the broker can bear; else a one-line `CommandError`.

    Checked before anything starts, so a bad value is one line before the service subscribes, not a traceback
    after it has joined its queue.
    """
    if ttl != ttl:  # nan: no comparison is true of it
        raise CommandError(f"{option} must be a number of seconds from {MIN_TTL:g} to {MAX_TTL:g}, got nan")
    if ttl <= 0 or ttl > MAX_TTL:
        raise CommandError(f"{option} must be more than 0 and at most {MAX_TTL:g} seconds, got {ttl:g}")
    if ttl < MIN_TTL:
        raise CommandError(
            f"{option} must be at least {MIN_TTL:g} second, got {ttl:g}: heartbeats go every ttl/3, so a shorter lease "
            "floods the broker and expires at the first pause"
        )
    return ttl


def read_json(path: str, what: str) -> Any:
    """A JSON file's content, or a `CommandError` naming the file and what is wrong with it."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CommandError(f"cannot read the {what} file {path!r}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"the {what} file {path!r} is not JSON: {exc}") from None


def load_offer(service_path: str, tools_path: str, topics: Topics = DEFAULT_TOPICS) -> tuple[Any, Any]:
    """The service and tool descriptors from their files, checked exactly as `toolreg serve` checks a service's."""
    service = read_json(service_path, "--service")
    tools = read_json(tools_path, "--tools")
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(service, dict) or not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise CommandError(
            "--service must hold a JSON object (a tool-service descriptor) and --tools a JSON list of tool descriptors"
        )
    if not tools:
        raise CommandError(f"{tools_path!r} lists no tools; a service with nothing to offer is not worth announcing")
    try:
        return build_descriptors(service, tools, topics)
    except ServiceDefinitionError as exc:
        raise CommandError(f"{service_path}: {exc}") from None


def check_options(args: argparse.Namespace) -> None:
    check_ttl(args.ttl)
    try:
        check_name(args.workspace, "workspace")
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if len(args.service_version) > MAX_VERSION:
        raise CommandError(f"--service-version is longer than {MAX_VERSION} characters")


async def cmd_announce(args: argparse.Namespace) -> int:
    if args.mcp or args.mcp_url is not None:
        check_options(args)
        return await cmd_announce_mcp(args)
    if args.command_line:
        raise CommandError(f"unexpected {' '.join(args.command_line)!r}: a command to run is for --mcp -- COMMAND")
    if args.service is None or args.tools is None:
        raise CommandError(
            "toolreg announce needs --service and --tools (a service of your own), --mcp -- COMMAND or --mcp-url URL"
        )
    check_options(args)
    settings = settings_of(args)
    service, tools = load_offer(args.service, args.tools, settings.topics)
    key_source = args.signing_key or settings.signing_key_file
    signing_key = load_private_key(key_source) if key_source else None
    async with AsyncExitStack() as stack:
        connection = await open_transport(settings)
        stack.push_async_callback(connection.close)
        announcer = Announcer(
            connection,
            service,
            tools,
            ttl=args.ttl,
            workspace=args.workspace,
            version=args.service_version,
            signing_key=signing_key,
        )
        stack.push_async_callback(announcer.stop)
        await announcer.start()
        names = ", ".join(tool.name for tool in tools)
        signed = "signed" if signing_key is not None else "unsigned"
        print(
            f"announcing {service.id} ({names}) in workspace {args.workspace!r} as instance {announcer.instance}, "
            f"ttl {args.ttl:g}s, {signed}; SIGTERM or Ctrl-C withdraws",
            flush=True,
        )
        await wait_for_signal()
    print(f"withdrawn {service.id}", flush=True)
    return 0


def add_command(subparsers: Any, common_parent: argparse.ArgumentParser) -> None:
    """Register `toolreg announce` on the `toolreg` parser."""
    announce = subparsers.add_parser(
        "announce",
        parents=[common_parent],
        help="announce a running service that cannot announce itself, or an MCP server's tools (a sidecar)",
        description=(
            "Announce a tool service on its behalf until SIGTERM or Ctrl-C, then withdraw it: for services not built "
            "on DynamicToolService, such as a stock TrustGraph one (--service, --tools), or for an MCP server, whose "
            "calls it answers by calling the server (--mcp -- COMMAND ARGS..., or --mcp-url URL). Run it beside the "
            "service so both stop together."
        ),
    )
    announce.add_argument(
        "--service",
        metavar="SVC.JSON",
        help="the tool-service descriptor (id, request-queue, response-queue, config-params)",
    )
    announce.add_argument(
        "--tools",
        metavar="TOOLS.JSON",
        help="a JSON list of its tool descriptors ('type' and 'service' may be left out)",
    )
    announce.add_argument(
        "--ttl",
        type=float,
        default=DEFAULT_TTL,
        help=f"lease length in seconds, {MIN_TTL:g} to {MAX_TTL:g} (default {DEFAULT_TTL:g})",
    )
    announce.add_argument("--workspace", default="default", help="workspace the tools belong to (default: default)")
    announce.add_argument(
        "--signing-key",
        default=None,
        metavar="PATH",
        help="Ed25519 private key to sign announcements with (env TOOLREG_SIGNING_KEY; make one with `toolreg keygen`)",
    )
    announce.add_argument(
        "--service-version", default="", metavar="TEXT", help="the service's version, shown by `toolreg tools --json`"
    )
    add_mcp_options(announce)
    announce.set_defaults(handler=cmd_announce)

"""`toolreg announce --mcp -- COMMAND ARGS...` and `toolreg announce --mcp-url URL`: an MCP server joins the fleet.

The sidecar is `McpToolService` (`toolservice_base.mcp_service`) run until
SIGTERM or Ctrl-C: it starts the command (stdio) or connects to the endpoint
(streamable HTTP), lists the server's tools, announces them as one tool
service, answers their calls by calling the server, follows its
`list_changed`, withdraws while the server is away and comes back with it.
What cannot be announced (a server that never finishes its handshake, an
endpoint that answers 401, a tool over the limits) stops it before anything
is announced, in one line.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Any

from toolservice_base.schemas import check_name
from toolservice_base.signing import load_private_key
from toolservice_base.transport import open_transport

from .common import CommandError, settings_of, settle_heap, wait_for_signal


def _pairs(values: list[str], option: str, separator: str = "=") -> dict[str, str]:
    """`K=V` options as a dict; a `NAME` alone (for `--env`) takes this process's value."""
    pairs: dict[str, str] = {}
    for value in values:
        key, found, text = value.partition(separator)
        if not found and option == "--env" and key in os.environ:
            text = os.environ[key]
        elif not found or not key.strip():
            raise CommandError(f"{option} takes NAME{separator}VALUE, got {value!r}")
        pairs[key.strip()] = text.strip() if option == "--header" else text
    return pairs


def _server(args: argparse.Namespace) -> Any:
    from toolservice_base.mcp_service import McpCommand, McpUrl

    if args.mcp_url is not None:
        if args.command_line:
            raise CommandError("give --mcp-url or --mcp -- COMMAND, not both")
        if not args.mcp_url.startswith(("http://", "https://")):
            raise CommandError(f"--mcp-url must be an http:// or https:// URL, got {args.mcp_url!r}")
        return McpUrl(args.mcp_url, _pairs(args.header, "--header"))
    if not args.command_line:
        raise CommandError("--mcp needs the server's command after --: toolreg announce --mcp -- COMMAND ARGS...")
    command, *rest = args.command_line
    return McpCommand(command, tuple(rest), _pairs(args.env, "--env"))


async def cmd_announce_mcp(args: argparse.Namespace) -> int:
    from toolservice_base.mcp_service import McpToolService

    logging.getLogger("httpx2").setLevel(logging.WARNING)  # a line per HTTP request to the server, at info

    if args.service_id is not None:
        try:
            check_name(args.service_id, "--service-id")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    if not args.mcp_timeout > 0:
        raise CommandError(f"--mcp-timeout must be a positive number of seconds, got {args.mcp_timeout:g}")
    server = _server(args)
    settings = settings_of(args)
    key_source = args.signing_key or settings.signing_key_file
    signing_key = load_private_key(key_source) if key_source else None
    connection = await open_transport(settings)
    try:
        sidecar = McpToolService(
            server,
            service_id=args.service_id,
            settings=settings,
            connection=connection,
            ttl=args.ttl,
            workspace=args.workspace,
            signing_key=signing_key,
            version=args.service_version,
            call_timeout=args.call_timeout,
            timeout=args.mcp_timeout,
            include=args.only,
            exclude=args.exclude,
        )
        async with sidecar:
            settle_heap()
            signalled = asyncio.ensure_future(wait_for_signal())
            await asyncio.sleep(0)  # its handlers are in place before the line that tells a supervisor we run
            offer = sidecar.offer
            assert offer is not None
            names = ", ".join(tool.name for tool in offer.tools)
            signed = "signed" if signing_key is not None else "unsigned"
            print(
                f"announcing {offer.service.id} ({names}) from the MCP server {server} in workspace "
                f"{args.workspace!r}, ttl {args.ttl:g}s, {signed}; SIGTERM or Ctrl-C withdraws",
                flush=True,
            )
            await signalled
        print(f"withdrawn {offer.service.id}", flush=True)
    finally:
        await connection.close()
    return 0


def add_mcp_options(announce: argparse.ArgumentParser) -> None:
    """The options of `toolreg announce` that bring an MCP server in."""
    group = announce.add_argument_group(
        "an MCP server",
        "toolreg announce --mcp -- COMMAND ARGS... (stdio) or --mcp-url URL (streamable HTTP): the server's tools "
        "announced as one service, answered by the server, followed while it runs",
    )
    group.add_argument(
        "--mcp", action="store_true", help="announce the MCP server that the command after -- runs (stdio)"
    )
    group.add_argument("--mcp-url", metavar="URL", help="announce the MCP server at this streamable-HTTP endpoint")
    group.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --mcp-url: an HTTP header sent on every request (repeat it), say 'Authorization=Bearer TOKEN'",
    )
    group.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="with --mcp: an environment variable for the command (repeat it; NAME alone passes this one's); it "
        "gets only HOME, PATH, USER, SHELL, TERM and LOGNAME otherwise",
    )
    group.add_argument(
        "--service-id",
        metavar="ID",
        help="the service's id (default: the server's own name, 'mcp-servers/everything' as mcp-servers-everything)",
    )
    group.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="announce only the tools whose MCP names match (shell pattern; repeat it)",
    )
    group.add_argument(
        "--exclude", action="append", default=[], metavar="PATTERN", help="leave out the tools whose names match"
    )
    group.add_argument(
        "--mcp-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long the server has to finish its handshake, list its tools or answer a ping (default 30)",
    )
    group.add_argument(
        "--call-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="the longest one call may run, whatever its caller would wait (default 120)",
    )
    group.add_argument("command_line", nargs="*", metavar="-- COMMAND ARGS", help=argparse.SUPPRESS)

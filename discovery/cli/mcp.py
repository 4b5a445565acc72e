"""`toolreg mcp`: serve one workspace's live tools to MCP clients, over stdio or streamable HTTP.

    toolreg mcp                                   stdio (what desktop and CLI clients spawn)
    toolreg mcp --http 127.0.0.1:8765             streamable HTTP at http://127.0.0.1:8765/mcp
    toolreg mcp --tools 'calc*' --exclude 'calc.debug*' --workspace research
    toolreg mcp --search                          two tools (search_tools, call_tool) in front of every live one

On stdio, stdout is the protocol channel: the SDK's stdio transport points
fd 1 at stderr for the whole run, and it is entered *before* anything
connects to the broker, so nothing the product or pulsar-client prints (its
console logger writes to stdout) can land on the wire. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING

from discovery.mcp.settings import McpSettings
from toolservice_base.logs import get_logger
from toolservice_base.rpc import DEFAULT_CALL_TIMEOUT
from toolservice_base.schemas import check_name
from toolservice_base.settings import Settings
from toolservice_base.transport import broker_unreachable

from .common import CommandError, settings_of, settle_heap, wait_for_signal

if TYPE_CHECKING:
    from agent_bridge import ToolSet
    from discovery.mcp.auth import Gate, OAuthSettings
    from discovery.mcp.server import McpFront

log = get_logger("discovery.mcp")

TOKEN_ENV = McpSettings.env("token")
_named = McpSettings.env
DEFAULT_HTTP = "127.0.0.1:8765"
BROKER_CHECK_TIMEOUT = 2.0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    mcp = sub.add_parser(
        "mcp",
        parents=[common],
        help="serve a workspace's live tools to MCP clients (stdio, or streamable HTTP)",
        description=(
            "Serve the live tools of one workspace as an MCP server: stdio by default, streamable HTTP with --http. "
            "Clients are told of every change (tools/list_changed, or subscriptions/listen on 2026-07-28)."
        ),
    )
    mcp.add_argument("--workspace", default="default", help="config workspace whose tools to serve (default: default)")
    _add_http_options(mcp)
    mcp.add_argument(
        "--tools",
        action="extend",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="serve only tools whose name matches one of these shell patterns (default: all)",
    )
    mcp.add_argument(
        "--exclude",
        action="extend",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="leave out tools whose name matches one of these shell patterns",
    )
    mcp.add_argument(
        "--search",
        action="store_true",
        help=(
            "list only search_tools and call_tool: a client finds the live tools it needs by words (ranked by match,"
            " then by health as the registry and this front's own calls see it) instead of being sent them all"
        ),
    )
    mcp.add_argument("--user", default="", help="the caller passed to tool services with every call")
    mcp.add_argument(
        "--call-timeout",
        type=float,
        default=DEFAULT_CALL_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds to wait for each answer of a tool service (default {DEFAULT_CALL_TIMEOUT:g})",
    )
    mcp.add_argument("--static-dir", default=None, help="fallback directory of tool-service/*.json and tool/*.json")
    _add_access_options(mcp)
    mcp.set_defaults(handler=cmd_mcp)


def _add_access_options(mcp: argparse.ArgumentParser) -> None:
    """Who may call: OAuth 2.1 with --http, the access policy, the per-caller rate limit, the audit topic."""
    mcp.add_argument(
        "--oauth-issuer",
        default=None,
        metavar="URL",
        help=(
            "with --http, be an OAuth 2.1 resource server for access tokens of this authorization server "
            f"(env {_named('oauth_issuer')}); replaces the static token"
        ),
    )
    mcp.add_argument(
        "--resource",
        default=None,
        metavar="URL",
        help=(
            "the canonical URI clients reach this server by, which tokens must name as audience "
            f"(env {_named('resource')}; default the URL served, e.g. http://127.0.0.1:8765/mcp)"
        ),
    )
    mcp.add_argument(
        "--policy",
        default=None,
        metavar="FILE",
        help=f"access policy: which scopes and claims may call which tools (JSON; env {_named('policy')}); needs OAuth",
    )
    mcp.add_argument(
        "--rate-limit",
        type=float,
        default=None,
        metavar="CALLS_PER_S",
        help=f"tool calls per second each caller may make; more get a retry-after (env {_named('rate_limit')})",
    )
    mcp.add_argument(
        "--audit-topic",
        action="store_true",
        default=None,
        help=f"also publish every call on the persistent topic <topicspace>/audit/mcp-calls ({_named('audit_topic')})",
    )
    mcp.add_argument(
        "--audit-key",
        default=None,
        metavar="FILE",
        help=(
            f"sign and chain the audit records with this Ed25519 key from `toolreg keygen` ({_named('audit_key')});"
            " verifiers trust its public key with `toolreg trust add-front`"
        ),
    )


def _add_http_options(mcp: argparse.ArgumentParser) -> None:
    """--http and what guards it: the bearer token and the Host names answered to."""
    mcp.add_argument(
        "--http",
        nargs="?",
        const=DEFAULT_HTTP,
        default=None,
        metavar="HOST:PORT",
        help=(
            f"serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (default address {DEFAULT_HTTP}; "
            "port 0 picks a free one)"
        ),
    )
    mcp.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help=f"with --http, require `Authorization: Bearer <token>` with the token in this file (env {TOKEN_ENV})",
    )
    mcp.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help=(
            "with --http, also answer to this Host name (a DNS name clients reach a non-loopback address by); "
            "the bound address, and on loopback localhost, always are. Any other Host or Origin gets 403 "
            "(DNS-rebinding defence)"
        ),
    )


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[v6]:PORT` or `:PORT` (loopback); a CommandError says what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise CommandError(f"--http takes HOST:PORT (e.g. {DEFAULT_HTTP}), got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def read_token(args: argparse.Namespace, config: McpSettings) -> str | None:
    """The bearer token: --token-file, else TOOLREG_MCP_TOKEN, else none."""
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise CommandError(f"cannot read --token-file {args.token_file}: {exc.strerror or exc}") from None
        if not token:
            raise CommandError(f"--token-file {args.token_file} is empty; put the token in it")
        return token
    return config.token


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def check_broker(url: str, timeout: float = BROKER_CHECK_TIMEOUT) -> None:
    """Fail at once, in one line, when nothing listens at the broker's address (pulsar-client would retry for long)."""
    reason = await broker_unreachable(url, timeout)
    if reason is not None:
        raise CommandError(reason)


async def _until_signal(work: Awaitable[None]) -> None:
    """Run `work` until it ends or SIGTERM/SIGINT arrives, whichever is first."""
    serving = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(wait_for_signal())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    for task in (stopping, serving):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error inside task-group wrappers (the SDK's stdio transport runs in one), so it prints as one line."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


async def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        return await _serve(args)
    except BaseExceptionGroup as group:
        raise _sole(group) from None


def _address_and_token(args: argparse.Namespace, config: McpSettings) -> tuple[tuple[str, int] | None, str | None]:
    """Where to serve HTTP (None: stdio) and the bearer token; a warning for HTTP off loopback without a token, or a
    token given for stdio."""
    address = None
    token = read_token(args, config)
    if args.http is not None:
        address = parse_address(args.http)
        if token is None and not _is_loopback(address[0]):
            log.warning(
                "mcp.unprotected",
                host=address[0],
                hint=f"anyone who reaches it can call the tools; set {TOKEN_ENV} or --token-file",
            )
    elif token is not None:
        log.warning(
            "mcp.token_ignored",
            reason="the bearer token applies to --http only; stdio is private to the client that spawned this process",
        )
    return address, token


def _check_access(address: tuple[str, int] | None, token: str | None, oauth: OAuthSettings | None, gate: Gate) -> None:
    """Refuse what cannot mean what the operator wants: a policy nobody's token is checked against."""
    if oauth is None and gate.policy is not None:
        raise CommandError(
            "an access policy grants tools to the scopes and claims of OAuth tokens: serve with --http and "
            f"--oauth-issuer (or {_named('oauth_issuer')}), or leave out --policy"
        )
    if oauth is not None and address is None:
        raise CommandError("--oauth-issuer protects --http; stdio is private to the client that spawned this process")
    if oauth is not None and token is not None:
        log.warning("mcp.token_ignored", reason="OAuth access tokens are checked instead of the static bearer token")


async def _publish_audit(stack: contextlib.AsyncExitStack, gate: Gate, settings: Settings) -> None:
    """Every call also on the audit topic, through a connection of its own (the ToolSet's is its own business)."""
    from toolservice_base.transport import open_transport

    transport = await stack.enter_async_context(await open_transport(settings))
    await stack.enter_async_context(gate.trail.publishing(transport))


async def _open_toolset(stack: contextlib.AsyncExitStack, args: argparse.Namespace, settings: Settings) -> ToolSet:
    """The workspace's live `ToolSet`, closed by `stack`; a store that does not answer and no fallback is one line."""
    from agent_bridge import BridgeUnavailable, ToolSet

    from .call import flag_names, say_fallback

    try:
        tools = await stack.enter_async_context(
            ToolSet(
                workspace=args.workspace,
                settings=settings,
                user=args.user,
                limits=args.call_timeout,
                static_dir=Path(args.static_dir) if args.static_dir else None,
            )
        )
    except BridgeUnavailable as exc:
        raise CommandError(flag_names(exc)) from None
    say_fallback(tools, tools.store_timeout)
    return tools


async def _follow_registry(stack: contextlib.AsyncExitStack, tools: ToolSet, settings: Settings) -> None:
    """Rank searches by what the registry says of each tool too, for as long as `stack` is open (a registry that
    does not answer only leaves the front's own calls to rank by)."""
    from discovery.registry.client import RegistryClient
    from toolservice_base.transport import open_transport

    from .search_health import follow_registry

    connection = await open_transport(settings)
    stack.push_async_callback(connection.close)
    client = await RegistryClient(connection).start()
    stack.push_async_callback(client.close)
    task = asyncio.create_task(follow_registry(tools, client), name="mcp-search-health")

    async def stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(stop)


def _oauth_settings(args: argparse.Namespace, config: McpSettings, gate: Gate) -> OAuthSettings | None:
    """The resource server's settings when --oauth-issuer (or its variable) names an issuer; else None."""
    from discovery.mcp.auth import OAuthSettings
    from discovery.mcp.auth.http import scopes_named

    issuer = args.oauth_issuer or config.oauth_issuer
    if issuer is None:
        return None
    policy = gate.policy
    return OAuthSettings(
        issuer=issuer,
        resource=args.resource or config.resource,
        jwks_uri=config.jwks_uri,
        introspection_client=config.introspection_client,
        introspection_secret=config.introspection_secret,
        algorithms=config.token_algorithms,
        skew=config.clock_skew,
        required_scopes=policy.required_scopes if policy is not None else (),
        scopes=scopes_named(policy.required_scopes, policy.scopes()) if policy is not None else (),
    )


def _gate(args: argparse.Namespace, config: McpSettings, token: str | None) -> Gate:
    """The front's gate: its access policy, rate limit and audit trail, and who its local caller is."""
    from discovery.mcp.auth import AccessPolicy, AccessPolicyError, AuditTrail, Caller, Gate, RateLimiter
    from toolservice_base.signing import load_private_key

    policy_file = Path(args.policy) if args.policy else config.policy
    try:
        policy = AccessPolicy.load(policy_file) if policy_file is not None else None
    except AccessPolicyError as exc:
        raise CommandError(str(exc)) from None
    rate = args.rate_limit if args.rate_limit is not None else config.rate_limit
    if rate is not None and not rate > 0:
        raise CommandError(f"--rate-limit must be above 0 calls per second, got {rate:g}")
    local = "stdio" if args.http is None else "bearer-token" if token else "anonymous"
    key_file = args.audit_key or config.audit_key
    key = load_private_key(key_file) if key_file is not None else None
    return Gate(
        args.workspace,
        policy=policy,
        limiter=RateLimiter(rate) if rate is not None else None,
        audit=AuditTrail(args.workspace, arguments=config.audit_arguments, key=key),
        local=Caller(local),
    )


async def _front(
    stack: contextlib.AsyncExitStack,
    args: argparse.Namespace,
    settings: Settings,
    config: McpSettings,
    tools: ToolSet,
    gate: Gate,
) -> McpFront:
    """The MCP front on `tools` behind `gate`: its audit records published when asked; a call of a name it does not
    list asks the registry whether that tool is held (`held.HeldLookup`); with `--search`, the registry's view of
    each tool's health follows too."""
    from discovery.mcp.server import McpFront

    from .held import HeldLookup

    if args.audit_topic or config.audit_topic:
        await _publish_audit(stack, gate, settings)
    held = HeldLookup(settings, args.workspace)
    stack.push_async_callback(held.close)
    front = McpFront(
        tools,
        include=args.tools,
        exclude=args.exclude,
        user=args.user,
        search=args.search,
        gate=gate,
        explain_unknown=held.explain,
    )
    if args.search:
        await _follow_registry(stack, tools, settings)
    return front


async def _serve(args: argparse.Namespace) -> int:
    # Imported here: the SDK takes ~0.7 s to import, which no other command should pay.
    from mcp.server.stdio import stdio_server

    from discovery.mcp.transports import StdinLines, serve_streams

    try:
        check_name(args.workspace, "workspace")
    except ValueError as exc:
        raise CommandError(f"--workspace: {exc}") from None
    settings = settings_of(args)
    config = McpSettings.from_env()
    address, token = _address_and_token(args, config)
    gate = _gate(args, config, token)
    oauth = _oauth_settings(args, config, gate)
    _check_access(address, token, oauth, gate)
    url = settings.resolve_pulsar_url()  # NoBrokerError (one line) when none is configured

    async with contextlib.AsyncExitStack() as stack:
        streams = None
        if address is None:
            # First: from here on fd 1 is the client's alone, before pulsar-client can print to it.
            stdin = await StdinLines().open()
            streams = await stack.enter_async_context(stdio_server(stdin=stdin))  # type: ignore[arg-type]
            if stdin is not None:
                stack.callback(stdin.stop)  # runs before the transport closes, which waits for its reader
        await check_broker(url)
        tools = await _open_toolset(stack, args, settings)
        front = await _front(stack, args, settings, config, tools, gate)

        def serving(**where: str) -> None:  # said once it does: for HTTP, after the port is bound
            settle_heap()
            log.info(
                "mcp.serving",
                workspace=tools.workspace,
                tools=len(front.listing().tools),
                source=tools.source,
                version=tools.version,
                **where,
            )

        if streams is not None:
            serving(transport="stdio")
            await _until_signal(serve_streams(front, *streams))
        else:
            assert address is not None
            endpoint = await _listen(stack, front, address, token, oauth, args.allow_host, config)
            serving(transport="http", endpoint=endpoint)
            guarded = (
                f" (OAuth 2.1: tokens of {oauth.issuer})" if oauth else " (bearer token required)" if token else ""
            )
            print(f"mcp           {endpoint}{guarded}", flush=True)
            await wait_for_signal()
    return 0


async def _listen(
    stack: contextlib.AsyncExitStack,
    front: McpFront,
    address: tuple[str, int],
    token: str | None,
    oauth: OAuthSettings | None,
    allowed_hosts: list[str],
    config: McpSettings,
) -> str:
    """Serve `front` over streamable HTTP until `stack` closes; its endpoint, or one line saying why it cannot."""
    from discovery.mcp.auth import IssuerError
    from discovery.mcp.transports import http_server

    try:
        return await stack.enter_async_context(
            http_server(
                front,
                *address,
                token=token,
                oauth=oauth,
                allowed_hosts=allowed_hosts,
                session_idle=config.session_idle,
                max_sessions=config.max_sessions,
            )
        )
    except (OSError, IssuerError) as exc:
        raise CommandError(str(exc)) from None

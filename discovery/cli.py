"""`toolreg`: run the product and talk to it.

    toolreg up                      broker (embedded unless PULSAR_URL) + config store + registry
    toolreg serve MODULE:CLASS      run a DynamicToolService subclass
    toolreg announce --service S --tools T   announce a service that cannot announce itself
    toolreg config put|get|list|delete
    toolreg call TOOL key=value ... invoke a tool through the agent bridge
    toolreg mcp [--http HOST:PORT]  serve a workspace's live tools to MCP clients
    toolreg tools|rejections|conflicts|release|registry
    toolreg store check|backup|restore

Every command takes `--data-dir` (or TOOLREG_DATA_DIR, default ./.toolreg),
where `toolreg up` leaves the embedded broker's URL for the others to find.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from toolservice_base import (
    ConfigClient,
    DynamicToolService,
    EmbeddedBroker,
    RequestTimeout,
    ServiceDefinitionError,
    ToolDiscoveryError,
    configure_logging,
    open_transport,
)
from toolservice_base.broker_supervisor import BrokerSupervisor
from toolservice_base.signing import SigningError

from . import cli_announce, cli_mcp, cli_registry, cli_store, cli_trust
from .cli_common import CommandError, UpLock, fail, settings_of, show_registry_page, start_health, wait_for_signal
from .config_ops import STORE_PROTOCOLS
from .configsvc import STORE_FILE, ConfigStoreService
from .health import DEFAULT_METRICS_PORT
from .otel import configure_tracing
from .registry import Registry
from .store import ConfigStore

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


# --- toolreg up ------------------------------------------------------------


async def cmd_up(args: argparse.Namespace) -> int:
    """Broker, store, registry: each step's undo goes on the exit stack as it succeeds.

    A failure at any step (or Ctrl-C) unwinds exactly the steps before it, in
    reverse: no broker, connection or task is left behind, and the error
    reaches `run` as one line.
    """
    settings = settings_of(args)
    options = cli_registry.registry_options(args)
    started = time.perf_counter()
    up = False
    async with AsyncExitStack() as stack:
        lock = UpLock(settings.data_dir)
        stack.callback(lock.release)
        lock.acquire()
        config = ConfigStore(settings.data_dir / STORE_FILE)  # checked before anything starts: a damaged store stops us here
        stack.callback(config.close)
        health = await start_health(stack, args.metrics_port)
        if health is not None:
            health.add_check("startup", lambda: None if up else "starting")
            print(f"metrics       {health.url}/metrics (and /healthz, /readyz)")
        watched: list[asyncio.Task[Any]] = []
        if settings.pulsar_url:
            url = settings.pulsar_url
            print(f"broker        {url} (PULSAR_URL)")
        else:
            broker = EmbeddedBroker(settings.data_dir)
            url = broker.start(port=args.port, adopt=True)
            stack.callback(broker.stop)
            supervisor = BrokerSupervisor(broker)
            watched.append(await stack.enter_async_context(supervisor.running()))
            if health is not None:
                health.add_check("broker", supervisor.readiness)
            how = "adopted from a previous `toolreg up`" if broker.adopted else "embedded pulsar-lite, loopback only"
            print(f"broker        {url} ({how}; restarted if it dies; URL in {broker.url_file})")
            if broker.port_note:
                print(f"note          {broker.port_note}")
        connection = await open_transport(settings, url=url)
        stack.push_async_callback(connection.close)
        print(f"workarounds   {', '.join(connection.capabilities.enabled()) or 'none'} (for {settings.broker_kind(url)})")
        store = ConfigStoreService(connection, config, protocol=args.store_protocol)
        stack.push_async_callback(store.stop)
        await store.start()
        if health is not None:
            health.add_check("config-store", store.readiness)
        print(f"config store  {store.store.path} (version {store.store.version}; {args.store_protocol} protocol)")
        if not args.no_registry:
            registry = Registry(connection, options=options)
            stack.push_async_callback(registry.stop)
            await registry.start()
            if health is not None:
                health.add_check("registry", registry.readiness)
                print(f"page          {show_registry_page(health, registry)}")
            print(f"registry      listening on {connection.topics.tool_descriptors}")
            print(f"trust         {cli_registry.trust_line(options)}")
        up = True
        print(f"ready in {(time.perf_counter() - started) * 1000:.0f} ms; Ctrl-C to stop", flush=True)
        await wait_for_signal(*watched)
        up = False
        print("stopping", flush=True)
    return 0


# --- toolreg serve ---------------------------------------------------------


def load_service_class(target: str) -> type[DynamicToolService]:
    module_name, _, class_name = target.partition(":")
    if not module_name or not class_name:
        raise CommandError(f"expected MODULE:CLASS, got {target!r} (e.g. toolservice_base.examples.joke:JokeService)")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: services in the current directory are found
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"cannot import {module_name!r}: {exc}") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, DynamicToolService)):
        raise CommandError(f"{target!r} is not a DynamicToolService subclass")
    return cls


async def cmd_serve(args: argparse.Namespace) -> int:
    cls = load_service_class(args.target)
    try:
        service = cls(
            settings=settings_of(args),
            ttl=args.ttl,
            announce=False if args.no_announce else None,
            workspace=args.workspace,
            signing_key=args.signing_key,
            call_timeout=args.call_timeout,
        )
    except (ServiceDefinitionError, SigningError) as exc:
        raise CommandError(f"{args.target}: {exc}") from None
    async with AsyncExitStack() as stack:
        health = await start_health(stack, args.metrics_port)
        if health is not None:
            health.add_check("service", service.readiness)
        await service.run()
    return 0


# --- toolreg config --------------------------------------------------------


def split_item(ref: str) -> tuple[str, str]:
    item_type, sep, key = ref.partition("/")
    if not sep or not item_type or not key:
        raise CommandError(f"expected TYPE/KEY, got {ref!r} (e.g. tool/tell-joke)")
    return item_type, key


async def with_config(args: argparse.Namespace, action: Callable[[ConfigClient], Awaitable[int]]) -> int:
    async with AsyncExitStack() as stack:
        connection = await open_transport(settings_of(args))
        stack.push_async_callback(connection.close)
        client = ConfigClient(connection, workspace=args.workspace, timeout=args.timeout)
        stack.push_async_callback(client.close)
        try:
            return await action(client)
        except RequestTimeout:
            raise CommandError(f"the config store did not answer within {args.timeout:g}s; is `toolreg up` running?") from None


async def cmd_config_put(args: argparse.Namespace) -> int:
    item_type, key = split_item(args.item)
    value = args.value if args.value is not None else sys.stdin.read()
    if not value.strip():
        raise CommandError("no value: pass --value or pipe it on stdin")

    async def put(client: ConfigClient) -> int:
        version = await client.put([(item_type, key, value.strip())])
        print(f"{item_type}/{key} stored (config version {version})")
        return 0

    return await with_config(args, put)


async def cmd_config_get(args: argparse.Namespace) -> int:
    item_type, key = split_item(args.item)

    async def get(client: ConfigClient) -> int:
        found = await client.get([(item_type, key)])
        if (item_type, key) not in found:
            return fail(f"{item_type}/{key} not found in workspace {client.workspace!r}")
        value = found[(item_type, key)]
        try:
            print(json.dumps(json.loads(value), indent=2))
        except ValueError:
            print(value)
        return 0

    return await with_config(args, get)


async def cmd_config_list(args: argparse.Namespace) -> int:
    async def listing(client: ConfigClient) -> int:
        for key in await client.list(args.type):
            print(key)
        return 0

    return await with_config(args, listing)


async def cmd_config_delete(args: argparse.Namespace) -> int:
    item_type, key = split_item(args.item)

    async def delete(client: ConfigClient) -> int:
        if not await client.get([(item_type, key)]):
            return fail(f"{item_type}/{key} not found in workspace {client.workspace!r}")
        version = await client.delete([(item_type, key)])
        print(f"{item_type}/{key} deleted (config version {version})")
        return 0

    return await with_config(args, delete)


# --- toolreg call ----------------------------------------------------------


def parse_arguments(pairs: list[str], types: dict[str, str]) -> dict[str, Any]:
    """`key=value` pairs; a value is JSON unless the tool declares the argument a string."""
    result: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise CommandError(f"arguments are key=value, got {pair!r}")
        if types.get(key, "string") == "string":
            result[key] = raw
            continue
        try:
            result[key] = json.loads(raw)
        except ValueError:
            raise CommandError(f"argument {key!r} is declared {types[key]} but {raw!r} is not JSON") from None
    return result


async def cmd_call(args: argparse.Namespace) -> int:
    from agent_bridge import BadArguments, ToolError, ToolSet

    if getattr(args, "log_level", None) is None:
        configure_logging("warning")  # stdout is the observation; say --log-level info to see the bridge's events

    settings = settings_of(args)
    static_dir = Path(args.static_dir) if args.static_dir else None
    async with ToolSet(workspace=args.workspace, settings=settings, static_dir=static_dir) as tools:
        if args.tool not in tools.names():
            available = ", ".join(sorted(tools.names())) or "none"
            return fail(f"no tool {args.tool!r} in workspace {args.workspace!r} (available: {available})")
        spec = next(d for d in tools.describe() if d["name"] == args.tool)
        types = {name: prop.get("type", "string") for name, prop in spec["parameters"]["properties"].items()}
        arguments = parse_arguments(args.arguments, types)
        try:
            async for chunk in tools.stream(args.tool, arguments, user=args.user):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        except BadArguments as exc:
            usage = " ".join(f"{name}=<{kind}>" for name, kind in types.items()) or "no arguments"
            return fail(f"{exc.message}; it takes: {usage}")
        except ToolError as exc:
            print(file=sys.stdout)
            return fail(f"{args.tool} failed: {exc}")
        except RequestTimeout:
            return fail(f"{args.tool}: no answer from its service; is it running (toolreg serve ...)?")
        print()
    return 0


async def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import demo

    if getattr(args, "log_level", None) is None:
        configure_logging("warning")  # the story is the output; --log-level info shows the events too
    return await demo(args.dir)


# --- parser ----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's copy of these options must not reset a value given before it.
    common.add_argument(
        "--data-dir",
        default=argparse.SUPPRESS,
        help="where the broker URL, store and snapshots live (env TOOLREG_DATA_DIR, default ./.toolreg)",
    )
    common.add_argument("--log-level", default=argparse.SUPPRESS, help="debug, info, warning or error (env TOOLREG_LOG_LEVEL)")
    common.add_argument(
        "--topicspace",
        default=argparse.SUPPRESS,
        help="the Pulsar tenant every topic lives in (env TOOLREG_TOPICSPACE, default tg)",
    )

    parser = argparse.ArgumentParser(
        prog="toolreg",
        description="Tool discovery for LLM agents on Apache Pulsar.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    up = sub.add_parser("up", parents=[common], help="run broker (embedded unless PULSAR_URL), config store and registry",
                        description="Run the config store and the registry; without PULSAR_URL, also an embedded pulsar-lite broker on 127.0.0.1.")
    up.add_argument("--port", type=int, default=None, help="port for the embedded broker (default: the one it used last time if free, else a free one)")
    up.add_argument("--no-registry", action="store_true", help="run only the broker and the config store")
    up.add_argument("--store-protocol", choices=STORE_PROTOCOLS, default="toolreg",
                    help="toolreg (default): TrustGraph's config protocol plus our extensions; "
                         "trustgraph: behave exactly like TrustGraph's config service, extensions ignored (for testing against it)")
    cli_registry.add_registry_options(up)
    up.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                    help=f"serve /healthz, /readyz and /metrics on PORT, e.g. {DEFAULT_METRICS_PORT} (env TOOLREG_METRICS_PORT; "
                         "off by default; bound to 127.0.0.1 unless TOOLREG_METRICS_HOST)")
    up.set_defaults(handler=cmd_up)

    serve = sub.add_parser("serve", parents=[common], help="run a DynamicToolService subclass",
                           description="Run a tool service until SIGTERM or Ctrl-C, announcing itself unless told not to.")
    serve.add_argument("target", metavar="MODULE:CLASS", help="e.g. toolservice_base.examples.joke:JokeService")
    serve.add_argument("--ttl", type=float, default=None, help="lease length in seconds (default: the class's ttl, 15)")
    serve.add_argument("--no-announce", action="store_true", help="do not announce (for services wired by hand)")
    serve.add_argument("--workspace", default=None, help="workspace the tools belong to (default: the class's, 'default')")
    serve.add_argument("--call-timeout", type=float, default=None, metavar="SECONDS",
                       help="the longest one call may run, whatever its caller would wait (default: the class's call_timeout, 120)")
    serve.add_argument("--signing-key", default=None, metavar="PATH",
                       help="Ed25519 private key to sign announcements with (env TOOLREG_SIGNING_KEY; make one with `toolreg keygen`)")
    serve.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                       help=f"serve /healthz, /readyz and /metrics on PORT, e.g. {DEFAULT_METRICS_PORT} (env TOOLREG_METRICS_PORT; "
                            "off by default; bound to 127.0.0.1 unless TOOLREG_METRICS_HOST)")
    serve.set_defaults(handler=cmd_serve)

    config_common = argparse.ArgumentParser(add_help=False, parents=[common])
    config_common.add_argument("--workspace", default="default", help="config workspace (default: default)")
    config_common.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the store (default 5)")
    config = sub.add_parser("config", parents=[common], help="read and write config items",
                            description="Read and write config items: TYPE/KEY -> JSON text.")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    put = config_sub.add_parser("put", parents=[config_common], help="write TYPE/KEY (value from --value or stdin)",
                                description="Write one item. `tool` and `tool-service` values are validated; a bad one is refused.")
    put.add_argument("item", metavar="TYPE/KEY")
    put.add_argument("--value", default=None, help="the value (default: read stdin)")
    put.set_defaults(handler=cmd_config_put)
    get = config_sub.add_parser("get", parents=[config_common], help="print TYPE/KEY", description="Print one item.")
    get.add_argument("item", metavar="TYPE/KEY")
    get.set_defaults(handler=cmd_config_get)
    listing = config_sub.add_parser("list", parents=[config_common], help="list the keys of TYPE", description="List the keys of a type.")
    listing.add_argument("type", metavar="TYPE")
    listing.set_defaults(handler=cmd_config_list)
    delete = config_sub.add_parser("delete", parents=[config_common], help="delete TYPE/KEY", description="Delete one item.")
    delete.add_argument("item", metavar="TYPE/KEY")
    delete.set_defaults(handler=cmd_config_delete)

    call = sub.add_parser("call", parents=[common], help="invoke a tool through the agent bridge",
                          description="Invoke a tool as an agent would and print the observation (streamed chunks as they come).")
    call.add_argument("tool", metavar="TOOL")
    call.add_argument("arguments", nargs="*", metavar="KEY=VALUE", help="tool arguments; non-string ones as JSON (n=3)")
    call.add_argument("--workspace", default="default", help="config workspace (default: default)")
    call.add_argument("--user", default="", help="the caller, passed to the service")
    call.add_argument("--static-dir", default=None, help="fallback directory of tool-service/*.json and tool/*.json")
    call.set_defaults(handler=cmd_call)

    demo = sub.add_parser("demo", help="run the whole story on an embedded broker, step by step, with timings",
                          description="Start a broker, store and registry in a fresh directory (default ./.toolreg-demo, wiped first), "
                                      "then register, call, remove and hand-wire tools, printing each step with its timing.")
    demo.add_argument("--dir", default=None, help="the demo's own data directory (default ./.toolreg-demo; wiped first)")
    demo.set_defaults(handler=cmd_demo)

    cli_registry.add_commands(sub, common)
    cli_trust.add_commands(sub, common)
    cli_announce.add_command(sub, common)
    cli_store.add_commands(sub, common)
    cli_mcp.add_commands(sub, common)
    return parser


def run(handler: Handler, args: argparse.Namespace) -> int:
    """Run one command; the one place an error becomes a line on stderr and exit code 1.

    Every error of the product (`ToolDiscoveryError`) already says what went
    wrong and what to do, so it is printed as is, without a traceback.
    """
    configure_logging(getattr(args, "log_level", None))
    configure_tracing(f"toolreg-{getattr(args, 'command', 'command')}")
    try:
        return asyncio.run(handler(args))
    except ToolDiscoveryError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `toolreg tools | head`: the reader has gone, which is not an error. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args.handler, args)


# --- the spec's tg-* aliases -------------------------------------------------


def _alias(command: list[str], usage: str) -> Callable[[], int]:
    def entry() -> int:
        argv = sys.argv[1:]
        if not argv or argv[0] in ("-h", "--help"):
            print(f"usage: {usage}\n(alias of `toolreg {' '.join(command)}`; see `toolreg {' '.join(command)} --help`)")
            return 0 if argv else 2
        return main([*command, *argv])

    return entry


put_config_item = _alias(["config", "put"], "tg-put-config-item TYPE/KEY < value.json")
get_config_item = _alias(["config", "get"], "tg-get-config-item TYPE/KEY")
list_config_items = _alias(["config", "list"], "tg-list-config-items TYPE")
delete_config_item = _alias(["config", "delete"], "tg-delete-config-item TYPE/KEY")


if __name__ == "__main__":
    sys.exit(main())

"""`toolreg`: run the product and talk to it.

    toolreg up                      broker (embedded unless PULSAR_URL) + config store + registry
    toolreg init                    prepare a topicspace on an Apache Pulsar cluster
    toolreg grant service ID --role R   let a role serve exactly one tool service (its queues only)
    toolreg serve MODULE:CLASS      run a DynamicToolService subclass
    toolreg announce --service S --tools T   announce a service that cannot announce itself
    toolreg config put|get|list|delete
    toolreg call TOOL key=value ... invoke a tool through the agent bridge
    toolreg mcp [--http HOST:PORT]  serve a workspace's live tools to MCP clients
    toolreg tools|rejections|conflicts|release|registry
    toolreg store check|backup|restore
    toolreg completion bash|zsh|fish  a shell completion script (source it)

Every command takes `--data-dir` (or TOOLREG_DATA_DIR, default ./.toolreg),
where `toolreg up` leaves the embedded broker's URL for the others to find.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import sniffio

from toolservice_base import ToolDiscoveryError, configure_logging
from toolservice_base.errors import NotAuthorized
from toolservice_base.logs import get_logger
from toolservice_base.rpc import DEFAULT_CALL_TIMEOUT
from toolservice_base.settings import event_loop
from toolservice_base.settings import log_level as log_level_setting

from . import announce as cli_announce
from . import audit as cli_audit
from . import init as cli_init
from . import mcp as cli_mcp
from . import pins as cli_pins
from . import registry as cli_registry
from . import replicas as cli_replicas
from . import store as cli_store
from . import trust as cli_trust
from .common import Handler, fail, lazy
from .completion import SHELLS, script
from .kinds import role_refusal
from .otel import configure_tracing
from .output import screened
from .parsing import Parser, parent, subcommands

log = get_logger("discovery.cli")

DISTRIBUTION = "tool-discovery"
DEFAULT_METRICS_PORT = 9464  # discovery.web's default, named here so the help does not load the web stack
STORE_PROTOCOLS = ("toolreg", "trustgraph")


class _Version(argparse.Action):
    """`toolreg --version`: the installed distribution's version, read only when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option: str | None = None
    ) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version(DISTRIBUTION)
        except PackageNotFoundError:
            found = "unknown (not installed)"
        print(f"toolreg {found}")
        parser.exit()


def _examples(*lines: str) -> dict[str, Any]:
    """A subcommand's `--help` ends with these examples, kept as written."""
    return {
        "formatter_class": argparse.RawDescriptionHelpFormatter,
        "epilog": "examples:\n" + "".join(f"  {line}\n" for line in lines),
    }


def build_parser() -> argparse.ArgumentParser:
    """The whole `toolreg` command line. Loads no subsystem: a command's handler is imported when it runs (`lazy`)."""
    common = _common_options()
    parser = Parser(
        prog="toolreg",
        description="Tool discovery for LLM agents on Apache Pulsar.",
        parents=[common],
        **_examples(
            "toolreg up                                   # broker, config store and registry, in ./.toolreg",
            "toolreg serve toolservice_base.examples.joke:JokeService",
            "toolreg tools",
            "toolreg call tell-joke topic=cats",
            "toolreg <command> --help                     # each command's options and examples",
        ),
    )
    parser.add_argument("--version", action=_Version)
    sub = subcommands(parser, dest="command", metavar="COMMAND", required=True)

    _add_up(sub, common)
    cli_init.add_command(sub, common)
    cli_init.add_grant_command(sub, common)
    _add_serve(sub, common)
    _add_config(sub, common)
    _add_call(sub, common)
    _add_demo(sub)
    cli_registry.add_commands(sub, common)
    cli_pins.add_commands(sub, common)
    cli_trust.add_commands(sub, common)
    cli_announce.add_command(sub, common)
    cli_store.add_commands(sub, common)
    cli_mcp.add_commands(sub, common)
    cli_audit.add_commands(sub, common)
    cli_replicas.add_commands(sub, common)
    _add_completion(sub)
    return parser


def _common_options() -> argparse.ArgumentParser:
    """The options every command takes, before or after its name."""
    common = Parser(add_help=False)
    # SUPPRESS: a subcommand's copy of these options must not reset a value given before it.
    common.add_argument(
        "--data-dir",
        default=argparse.SUPPRESS,
        help="where the broker URL, store and snapshots live (env TOOLREG_DATA_DIR, default ./.toolreg)",
    )
    common.add_argument(
        "--log-level", default=argparse.SUPPRESS, help="debug, info, warning or error (env TOOLREG_LOG_LEVEL)"
    )
    common.add_argument(
        "--topicspace",
        default=argparse.SUPPRESS,
        help="the Pulsar tenant every topic lives in (env TOOLREG_TOPICSPACE, default tg)",
    )
    return common


def _add_up(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """`toolreg up`: broker, config store and registry in one process."""
    up = sub.add_parser(
        "up",
        parents=[common],
        help="run broker (embedded unless PULSAR_URL), config store and registry",
        description=(
            "Run the config store and the registry; without PULSAR_URL, also an embedded pulsar-lite broker on"
            " 127.0.0.1."
        ),
        **_examples(
            "toolreg up",
            "toolreg up --data-dir /var/lib/toolreg --metrics-port 9464",
            "PULSAR_URL=pulsar://broker:6650 toolreg up --trust-policy trust.json",
        ),
    )
    up.add_argument(
        "--port",
        type=int,
        default=None,
        help="port for the embedded broker (default: the one it used last time if free, else a free one)",
    )
    up.add_argument("--no-registry", action="store_true", help="run only the broker and the config store")
    _add_store_options(up)
    cli_registry.add_registry_options(up)
    up.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help=(
            f"serve /healthz, /readyz and /metrics on PORT, e.g. {DEFAULT_METRICS_PORT} (env TOOLREG_METRICS_PORT; "
            "off by default; bound to 127.0.0.1 unless TOOLREG_METRICS_HOST)"
        ),
    )
    up.set_defaults(handler=lazy("up", "cmd_up"))


def _add_store_options(up: argparse.ArgumentParser) -> None:
    """`toolreg up`'s config store: which backend, its takeover timeout when replicated, and its protocol."""
    up.add_argument(
        "--store",
        choices=("sqlite", "pulsar"),
        default=None,
        help=(
            "sqlite (default): a file in the data directory; pulsar: replicated on Apache Pulsar, in the topicspace's "
            "`state` namespace, so several `toolreg up` form one group with one active replica (env TOOLREG_STORE)"
        ),
    )
    up.add_argument(
        "--takeover-after",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help=(
            "--store pulsar: how long the active replica may be silent before a standby fences it and takes over"
            " (default 10)"
        ),
    )
    up.add_argument(
        "--store-protocol",
        choices=STORE_PROTOCOLS,
        default="toolreg",
        help=(
            "toolreg (default): TrustGraph's config protocol plus our extensions; "
            "trustgraph: behave exactly like TrustGraph's config service, extensions ignored (for testing against it)"
        ),
    )


def _add_serve(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """`toolreg serve MODULE:CLASS`: run a tool service."""
    serve = sub.add_parser(
        "serve",
        parents=[common],
        help="run a DynamicToolService subclass",
        description="Run a tool service until SIGTERM or Ctrl-C, announcing itself unless told not to.",
        **_examples(
            "toolreg serve toolservice_base.examples.joke:JokeService",
            "toolreg serve my_tools:SearchService --ttl 30 --workspace research --signing-key keys/search.key",
        ),
    )
    serve.add_argument("target", metavar="MODULE:CLASS", help="e.g. toolservice_base.examples.joke:JokeService")
    serve.add_argument("--ttl", type=float, default=None, help="lease length in seconds (default: the class's ttl, 15)")
    serve.add_argument("--no-announce", action="store_true", help="do not announce (for services wired by hand)")
    serve.add_argument(
        "--workspace", default=None, help="workspace the tools belong to (default: the class's, 'default')"
    )
    serve.add_argument(
        "--call-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the longest one call may run, whatever its caller would wait (default: the class's call_timeout, 120)",
    )
    serve.add_argument(
        "--signing-key",
        default=None,
        metavar="PATH",
        help="Ed25519 private key to sign announcements with (env TOOLREG_SIGNING_KEY; make one with `toolreg keygen`)",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help=(
            f"serve /healthz, /readyz and /metrics on PORT, e.g. {DEFAULT_METRICS_PORT} (env TOOLREG_METRICS_PORT; "
            "off by default; bound to 127.0.0.1 unless TOOLREG_METRICS_HOST)"
        ),
    )
    serve.set_defaults(handler=lazy("serve", "cmd_serve"))


def _add_config(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """`toolreg config put|get|list|delete`: config items by TYPE/KEY."""
    config_common = parent(common)
    config_common.add_argument("--workspace", default="default", help="config workspace (default: default)")
    config_common.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="the longest to wait for the broker and the store's answer together (default 5)",
    )
    config = sub.add_parser(
        "config",
        parents=[common],
        help="read and write config items",
        description="Read and write config items: TYPE/KEY -> JSON text.",
        **_examples(
            "toolreg config put tool-service/joke-service < joke-service.json",
            'toolreg config put tool/tell-joke --value \'{"type": "tool-service", "name": "tell-joke", "description":'
            ' "Tell a joke", "service": "joke-service"}\'',
            "toolreg config put tool/tell-joke --signing-key keys/alice.key < tell-joke.json   # a policy asks it",
            "toolreg config get tool/tell-joke",
            "toolreg config list tool --json",
            "toolreg config delete tool/tell-joke",
        ),
    )
    config_sub = subcommands(config, dest="config_command", metavar="ACTION", required=True)
    put = config_sub.add_parser(
        "put",
        parents=[config_common],
        help="write TYPE/KEY (value from --value or stdin)",
        description="Write one item. `tool` and `tool-service` values are validated; a bad one is refused.",
    )
    put.add_argument("item", metavar="TYPE/KEY")
    put.add_argument(
        "--value", default=None, help="the value (default: read stdin, up to end of file: Ctrl-D on a terminal)"
    )
    signing = (
        "sign the write with this operator's Ed25519 key (PEM, from `toolreg keygen`): a store whose trust policy"
        ' covers the config queue ("config-writes": "signed") takes writes of tool and tool-service items only so'
    )
    put.add_argument("--signing-key", default=None, metavar="PATH", help=signing)
    put.set_defaults(handler=lazy("config", "cmd_config_put"))
    _add_config_reads(config_sub, config_common)
    delete = config_sub.add_parser(
        "delete", parents=[config_common], help="delete TYPE/KEY", description="Delete one item."
    )
    delete.add_argument("item", metavar="TYPE/KEY")
    delete.add_argument("--signing-key", default=None, metavar="PATH", help=signing)
    delete.set_defaults(handler=lazy("config", "cmd_config_delete"))


def _add_config_reads(config_sub: argparse._SubParsersAction, config_common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """`toolreg config get` and `config list`."""
    get = config_sub.add_parser("get", parents=[config_common], help="print TYPE/KEY", description="Print one item.")
    get.add_argument("item", metavar="TYPE/KEY")
    get.add_argument(
        "--json",
        action="store_true",
        help='print {"type", "key", "workspace", "value"} (the value parsed when it is JSON) as one JSON object',
    )
    get.set_defaults(handler=lazy("config", "cmd_config_get"))
    listing = config_sub.add_parser(
        "list",
        parents=[config_common],
        help="list the keys of TYPE",
        description=(
            "List the keys of a type. A type the workspace holds no item of (other than tool and tool-service) is an"
            " error naming the types it has: more often a typo than an empty type."
        ),
    )
    listing.add_argument("type", metavar="TYPE")
    listing.add_argument("--json", action="store_true", help="print a JSON list of keys instead of one per line")
    listing.set_defaults(handler=lazy("config", "cmd_config_list"))


def _add_call(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """`toolreg call TOOL KEY=VALUE...`: a tool invoked through the agent bridge."""
    call = sub.add_parser(
        "call",
        parents=[common],
        help="invoke a tool through the agent bridge",
        description=(
            "Invoke a tool as an agent would and print the observation (streamed chunks as they come). "
            "TOOL is its name or the name OpenAI function calling was given for it (`acme_search` for `acme.search`)."
        ),
        **_examples(
            "toolreg call tell-joke topic=cats",
            "toolreg call calculate expression='2 * (3 + 4)' --json",
            "toolreg call swatch rgb=9,9,9 --save ./out   # images and files written, their paths printed",
            "toolreg call tell-joke topic=cats --timeout 5 --static-dir ./tools   # works with no config store",
        ),
    )
    call.add_argument("tool", metavar="TOOL")
    call.add_argument("arguments", nargs="*", metavar="KEY=VALUE", help="tool arguments; non-string ones as JSON (n=3)")
    call.add_argument("--workspace", default="default", help="config workspace (default: default)")
    call.add_argument("--user", default="", help="the caller, passed to the service")
    call.add_argument("--static-dir", default=None, help="fallback directory of tool-service/*.json and tool/*.json")
    call.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_CALL_TIMEOUT,
        metavar="SECONDS",
        help=(
            f"the longest to wait for the tool's answer (default {DEFAULT_CALL_TIMEOUT:g}); before the call, the config"
            " store is waited for at most 3 s (less if SECONDS is), then the snapshot or --static-dir is used"
        ),
    )
    call.add_argument(
        "--json",
        action="store_true",
        help=(
            'print {"tool", "workspace", "observation", "content"} as one JSON object once the answer is whole: '
            '"content" is the result\'s blocks (text, images, audio, resources), "structuredContent" too if it has one'
        ),
    )
    call.add_argument(
        "--save",
        default=None,
        metavar="DIR",
        help="write each image, audio or file of the result to DIR and print its path where the block would be",
    )
    call.set_defaults(handler=lazy("call", "cmd_call"))
    call.hint = _tool_arguments_hint


def _tool_arguments_hint(extras: list[str], given: Sequence[str]) -> str:
    """`toolreg call tell-joke --topic cats`: say that a tool's arguments are KEY=VALUE, with the pair it meant."""
    meant = []
    for option in (extra for extra in extras if extra.startswith("--") and len(extra) > 2):
        name, sep, value = option[2:].partition("=")
        if not sep:
            at = list(given).index(option) if option in given else -1
            following = given[at + 1] if 0 <= at < len(given) - 1 else ""
            value = following if following and not following.startswith("-") else "VALUE"
        meant.append(f"{name}={value}")
    if not meant:
        return ""
    return f"a tool's arguments are KEY=VALUE, not options: {' '.join(meant)}"


def _add_demo(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`toolreg demo`: the whole story on an embedded broker, in a directory of its own (so none of the common
    options)."""
    demo = sub.add_parser(
        "demo",
        help="run the whole story on an embedded broker, step by step, with timings",
        description=(
            "Start a broker, store and registry in a fresh directory (default ./.toolreg-demo, wiped first), "
            "then register, call, remove and hand-wire tools, printing each step with its timing."
        ),
    )
    demo.add_argument(
        "--dir", default=None, help="the demo's own data directory (default ./.toolreg-demo; wiped first)"
    )
    demo.set_defaults(handler=lazy("demo", "cmd_demo"))


def _add_completion(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`toolreg completion SHELL`: needs no broker and no data directory, so none of the common options."""
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script for bash, zsh or fish (source it: see --help)",
        description=(
            "Print a completion script for SHELL on stdout: Tab then completes toolreg's commands, subcommands, "
            "flags, their choices and file names. It is generated from this toolreg's own command line, so "
            "regenerate it after an upgrade. Completing runs nothing and needs no broker."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            'load it:\n  bash  eval "$(toolreg completion bash)"                    # in ~/.bashrc\n        toolreg'
            " completion bash > ~/.local/share/bash-completion/completions/toolreg   # or once, with bash-completion\n "
            ' zsh   eval "$(toolreg completion zsh)"                     # in ~/.zshrc, after compinit\n        toolreg'
            ' completion zsh > "${fpath[1]}/_toolreg"       # or once, into a directory of $fpath\n  fish  toolreg'
            " completion fish > ~/.config/fish/completions/toolreg.fish\n        toolreg completion fish | source      "
            "                # or for this shell only\n"
        ),
    )
    completion.add_argument("shell", metavar="SHELL", choices=SHELLS, help="bash, zsh or fish")
    completion.set_defaults(handler=cmd_completion)


async def cmd_completion(args: argparse.Namespace) -> int:
    """The completion script of the very parser every command runs (`completion.script`)."""
    sys.stdout.write(script(build_parser(), args.shell))
    return 0


def run_loop(handler: Handler, args: argparse.Namespace) -> int:
    """Run a command on uvloop where it is installed (`tool-discovery[uvloop]`; `TOOLREG_EVENT_LOOP` decides), else
    asyncio."""
    loop = event_loop()
    log.debug("toolreg.event_loop", loop=loop)
    if loop == "uvloop":
        import uvloop

        return uvloop.run(_on_asyncio(handler, args))
    return asyncio.run(_on_asyncio(handler, args))


async def _on_asyncio(handler: Handler, args: argparse.Namespace) -> int:
    """The command, with sniffio told the async library it runs on (`current_async_library_cvar`, which every task
    started from here inherits), as sniffio asks of whoever runs one.

    Why: anyio (under the MCP SDK, Starlette and httpx) asks sniffio which library runs for each cancel scope, event,
    stream and task group; untold, sniffio finds out through `asyncio.current_task()`, whose running-loop lookup is a
    `getpid()` system call on Python 3.11: 2.7 % of the MCP front's loop thread at 32 calls in flight."""
    sniffio.current_async_library_cvar.set("asyncio")
    return await handler(args)


SERVING = frozenset({"up", "serve", "registry", "announce", "mcp", "demo"})
"""Commands that run until stopped: their events (info and up) are what an operator watches, so they log at info."""


def log_level(args: argparse.Namespace) -> str | None:
    """The level a command logs at: `--log-level`, else TOOLREG_LOG_LEVEL, else info for a command that serves and
    warning for one that answers and exits, whose output is its answer (`toolreg store export` printed its reader's
    info events, JSON off a terminal, around it)."""
    given: str | None = getattr(args, "log_level", None)
    if given is not None or log_level_setting() is not None:
        return given
    return None if getattr(args, "command", None) in SERVING else "warning"


def run(handler: Handler, args: argparse.Namespace) -> int:
    """Run one command; the one place an error becomes a line on stderr and exit code 1.

    Every error of the product (`ToolDiscoveryError`) already says what went
    wrong and what to do, so it is printed as is, without a traceback.
    """
    configure_logging(log_level(args))
    configure_tracing(f"toolreg-{getattr(args, 'command', 'command')}")
    with screened():  # what strangers wrote reaches the terminal as visible escapes, not as control sequences
        try:
            return run_loop(handler, args)
        except NotAuthorized as exc:  # said for the kind of process the command runs as (`kinds`)
            return fail(role_refusal(getattr(args, "command", ""), exc) or str(exc))
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

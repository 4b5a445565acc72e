"""`toolreg call TOOL key=value ...`: invoke a tool as an agent would, through the agent bridge."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agent_bridge import BadArguments, ToolError, ToolSet
from toolservice_base import RequestTimeout, configure_logging

from .common import CommandError, fail, settings_of


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



"""`toolreg call TOOL key=value ...`: invoke a tool as an agent would, through the agent bridge."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from contextlib import ExitStack, aclosing
from pathlib import Path
from typing import Any

from agent_bridge import BadArguments, BridgeUnavailable, ToolError, ToolServiceImpl, ToolSet
from toolservice_base import RequestTimeout, configure_logging
from toolservice_base.schemas.content import ToolResult, merge

from .common import CommandError, fail, settings_of, waiting_for
from .saved import Saver
from .tool_arguments import argument_kinds, read_arguments, usage

STORE_WAIT = 3.0
"""Seconds it waits for the config store before it loads the snapshot or --static-dir (the ToolSet's default)."""
SUGGESTIONS = 5


def resolve(tools: ToolSet, name: str) -> str:
    """The tool's own name for `name`, which may be the form `as_openai_tools` gives it (`acme_search` for
    `acme.search`)."""
    if name in tools:
        return name
    mapped: dict[str, str] = {
        spec["function"]["name"]: own["name"] for own, spec in zip(tools.describe(), tools.as_openai_tools())
    }
    if name in mapped:
        return mapped[name]
    skipped = tools.problems
    if name in skipped:
        raise CommandError(f"tool {name!r} is in workspace {tools.workspace!r} but agents skip it: {skipped[name]}")
    names = tools.names()
    close = difflib.get_close_matches(name, [*names, *skipped], n=SUGGESTIONS)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise CommandError(
        f"no tool {name!r} in workspace {tools.workspace!r} ({len(names)} tool(s){hint}); `toolreg tools` lists them"
    )


def flag_names(error: BridgeUnavailable) -> str:
    """The bridge's message, with its Python keyword `static_dir` said as the flag a command-line user passes.

    Shared by every command that opens a `ToolSet` with `--static-dir` (`call`, `mcp`).
    """
    return (
        str(error)
        .replace("pass static_dir=<dir", "pass --static-dir <dir")
        .replace("no static_dir given", "no --static-dir given")
    )


def say_fallback(tools: ToolSet, waited: float) -> None:
    """When the tools come from a fallback, say so on stderr: which snapshot (or directory), how old, from where.

    A command-line user reads this where a library's user reads the `toolset.fallback` log event: an answer from
    a snapshot may be out of date, and one from the wrong deployment would be wrong, so it is never left unsaid.
    """
    if tools.source == "store":
        return
    where = tools.snapshot.describe() if tools.snapshot is not None else f"the static directory {tools.static_dir}"
    print(
        f"toolreg: warning: the config store did not answer within {waited:g}s; the tools come from {where},"
        " and may be out of date",
        file=sys.stderr,
        flush=True,
    )


def _what_answers(tools: ToolSet, name: str) -> str:
    impl = tools.get(name)
    if isinstance(impl, ToolServiceImpl):
        return f"{name}'s service {impl.service.id!r} to answer on {impl.service.request_queue} (is it running?)"
    return f"{name} to answer"


async def cmd_call(args: argparse.Namespace) -> int:
    if getattr(args, "log_level", None) is None:
        configure_logging("warning")  # stdout is the observation; say --log-level info to see the bridge's events

    settings = settings_of(args)
    static_dir = Path(args.static_dir) if args.static_dir else None
    timeout = args.timeout
    tools = ToolSet(
        workspace=args.workspace,
        settings=settings,
        static_dir=static_dir,
        store_timeout=min(STORE_WAIT, timeout),
        limits=timeout,
    )
    try:
        with waiting_for(f"the tools of workspace {args.workspace!r} from the config store"):
            await tools.start()
    except BridgeUnavailable as exc:
        raise CommandError(flag_names(exc)) from None
    say_fallback(tools, tools.store_timeout)
    try:
        try:
            name = resolve(tools, args.tool)
        except CommandError:
            from .held import HeldLookup  # only for a name not found: it asks the registry

            lookup = HeldLookup(settings, args.workspace)
            try:
                held = await lookup.explain(args.tool)
            finally:
                await lookup.close()
            if held is not None:
                raise CommandError(held) from None
            raise
        return await _call(args, tools, name)
    finally:
        await tools.close()


async def _call(args: argparse.Namespace, tools: ToolSet, name: str) -> int:
    spec = next(d for d in tools.describe() if d["name"] == name)
    arguments = read_arguments(args.arguments, spec["parameters"])
    saver = Saver(Path(args.save), name) if args.save else None
    parts: list[ToolResult] = []
    chunks: list[str] = []
    try:
        with ExitStack() as notice:
            notice.enter_context(waiting_for(_what_answers(tools, name)))
            async with aclosing(tools.parts(name, arguments, user=args.user)) as each:  # type: ignore[type-var]
                async for part in each:
                    notice.close()  # it answers: nothing more to wait for
                    parts.append(part)
                    if args.json:
                        continue
                    chunk = part.text if saver is None else "\n".join(saver.said(b) for b in part.content)
                    chunks.append(chunk)
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
    except BadArguments as exc:
        return fail(f"{exc.message}; it takes: {usage(argument_kinds(spec['parameters']))}")
    except ToolError as exc:
        if chunks:
            print()  # end the partial observation's line before the error's
        return fail(f"{name} failed: {exc}")
    except RequestTimeout as exc:
        if chunks:
            print()
        if exc.received:  # it answers, and was still answering at the deadline: say so, not that it may be gone
            return fail(f"{name}: {exc}")
        return fail(f"{name}: no answer from its service within {args.timeout:g}s; is it running (toolreg serve ...)?")
    if args.json:
        print(json.dumps(_as_json(args, name, merge(parts), saver)))
    else:
        print()
    return 0


def _as_json(args: argparse.Namespace, name: str, result: ToolResult, saver: Saver | None) -> dict[str, Any]:
    """What `--json` prints: the observation a text-only caller reads, and the result's blocks as MCP writes them
    (each binary one's bytes as a path under `--save DIR`, when given)."""
    body: dict[str, Any] = {"tool": name, "workspace": args.workspace, "observation": result.text}
    body["content"] = [b.to_wire() if saver is None else saver.wire(b) for b in result.content]
    if result.structured is not None:
        body["structuredContent"] = result.structured
    return body

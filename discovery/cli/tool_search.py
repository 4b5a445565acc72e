"""`toolreg tools --search QUERY`: a workspace's tools, best match first, as an agent's search ranks them.

The tools are read from the config store (what agents load), ranked as agents rank them: by what their names,
titles, descriptions and arguments mean and the words they share with the query (`toolservice_base.search.hybrid`,
the embedder `TOOLREG_SEARCH_EMBEDDER` names), and by what the registry says of them: a `held` or `unavailable`
tool is left out, a tool whose heartbeats count mostly errors comes after a healthy one that matches as well
(`toolservice_base.search.health`). A registry that does not answer leaves the ranking to text alone, and a
line on stderr says so.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack

from discovery.errors import RegistryUnavailable
from discovery.registry.client import RegistryClient
from discovery.registry.protocol import ToolStatus
from toolservice_base.configclient import ConfigClient
from toolservice_base.errors import BadQuery, RequestTimeout
from toolservice_base.schemas import ToolDescriptor, validate_config_item
from toolservice_base.search import UNKNOWN, Match, Ranker, SearchDoc, check_limit, query_terms, rank, ranker_for
from toolservice_base.search.settings import SearchSettings

from .common import CommandError, Deadline, connect, opened, waiting_for
from .output import Column, render
from .search_health import reports

DESCRIPTION_WIDTH = 72


async def cmd_search(args: argparse.Namespace) -> int:
    try:  # before anything is asked of the broker: a query that cannot be searched fails at once
        check_limit(args.limit)
        query_terms(args.search)
    except BadQuery as exc:
        raise CommandError(f"--search: {exc}") from None
    search = SearchSettings.from_env()  # so is an embedder that cannot be named
    deadline = Deadline(args.timeout)
    async with AsyncExitStack() as stack:
        connection = await connect(args, deadline)
        stack.push_async_callback(connection.close)
        config = ConfigClient(connection, workspace=args.workspace or "default", timeout=args.timeout)
        stack.push_async_callback(config.close)
        registry = RegistryClient(connection, timeout=args.timeout)
        stack.push_async_callback(registry.close)
        await opened(asyncio.gather(config.start(), registry.start()), connection.url, "the store's queues", deadline)
        try:
            with waiting_for("the config store to answer (is `toolreg up` running?)"):
                _, items = await config.read_types(("tool",), timeout=deadline.left(floor=1.0))
        except RequestTimeout:
            raise CommandError(
                f"the config store did not answer within {args.timeout:g}s; is `toolreg up` running?"
            ) from None
        registry.timeout = deadline.left(floor=1.0)
        try:
            statuses = {t.name: t for t in (await registry.list(args.workspace)).tools}
        except RegistryUnavailable:
            statuses = {}
            print("toolreg: the registry did not answer: ranked by text alone, statuses unknown", file=sys.stderr)
    tools = _parse(items.get("tool", {}))
    index = await asyncio.to_thread(_indexed, ranker_for(search.embedder, search.embedder_key), tools)
    health = reports(statuses.values())
    matches = rank(index, args.search, args.limit, health_of=lambda name: health.get(name, UNKNOWN))
    _print(args, matches, tools, statuses)
    return 0


def _indexed(make: Callable[[], Ranker], tools: dict[str, ToolDescriptor]) -> Ranker:
    """In a worker thread: the embedder loaded, the tools indexed."""
    index = make()
    index.stage({name: SearchDoc.of(tool) for name, tool in tools.items()})
    index.commit()
    index.refresh()
    return index


def _parse(raw: dict[str, str]) -> dict[str, ToolDescriptor]:
    """The tools agents would load; an item that does not parse is skipped, as agents skip it."""
    tools = {}
    for name, text in raw.items():
        try:
            tool = validate_config_item("tool", name, text)
        except ValueError:
            continue
        assert isinstance(tool, ToolDescriptor)
        tools[name] = tool
    return tools


def _print(
    args: argparse.Namespace, matches: list[Match], tools: dict[str, ToolDescriptor], statuses: dict[str, ToolStatus]
) -> None:
    """The ranking as `toolreg tools` prints its listing (`-o`, `--no-headers`); `-o wide` adds TITLE and RELEVANCE."""
    columns: list[Column[Match]] = [
        Column("TOOL", lambda m: m.name),
        Column("SCORE", lambda m: f"{m.score:.2f}"),
        Column("RELEVANCE", lambda m: f"{m.relevance:.2f}", wide=True),
        Column("STATUS", lambda m: m.health.status or "-"),
        Column("SERVICE", lambda m: tools[m.name].service or "-"),
        Column("TITLE", lambda m: tools[m.name].title or "-", wide=True),
        Column("DESCRIPTION", lambda m: _short(tools[m.name])),
    ]

    def record(m: Match) -> dict[str, object]:
        return {
            "name": m.name,
            "score": round(m.score, 3),
            "relevance": round(m.relevance, 3),
            "status": m.health.status,
            "failure_share": m.health.failure_share,
            "service": tools[m.name].service,
            "title": tools[m.name].title,
            "description": tools[m.name].description,
        }

    render(args, matches, columns, name=lambda m: m.name, record=record, empty=f"no tool matches {args.search!r}")


def _short(tool: ToolDescriptor) -> str:
    line = " ".join(tool.description.split())
    return line if len(line) <= DESCRIPTION_WIDTH else line[: DESCRIPTION_WIDTH - 1] + "…"

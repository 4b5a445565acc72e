"""`toolreg config put|get|list|delete` (and the spec's `tg-*-config-item` aliases)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from toolservice_base import ConfigClient, RequestTimeout

from .common import CommandError, Deadline, connect, fail, opened, waiting_for


def split_item(ref: str) -> tuple[str, str]:
    item_type, sep, key = ref.partition("/")
    if not sep or not item_type or not key:
        raise CommandError(f"expected TYPE/KEY, got {ref!r} (e.g. tool/tell-joke)")
    return item_type, key


async def with_config(args: argparse.Namespace, action: Callable[[ConfigClient], Awaitable[int]]) -> int:
    """Run `action` on a config client; `--timeout` bounds it all, connecting to the broker included."""
    deadline = Deadline(args.timeout)
    async with AsyncExitStack() as stack:
        connection = await connect(args, deadline)
        stack.push_async_callback(connection.close)
        client = ConfigClient(connection, workspace=args.workspace, timeout=args.timeout)
        stack.push_async_callback(client.close)
        await opened(client.start(), connection.url, "the config store's queues", deadline)
        client.timeout = deadline.left(floor=min(1.0, args.timeout))
        try:
            with waiting_for("the config store to answer (is `toolreg up` running?)"):
                return await action(client)
        except RequestTimeout:
            raise CommandError(
                f"the config store did not answer within {args.timeout:g}s; is `toolreg up` running?"
            ) from None


async def cmd_config_put(args: argparse.Namespace) -> int:
    item_type, key = split_item(args.item)
    if args.value is None and sys.stdin.isatty():
        print("toolreg: reading the value from stdin; end with Ctrl-D (or pass --value)", file=sys.stderr, flush=True)
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
        keys = await client.list(args.type)
        if getattr(args, "json", False):
            print(json.dumps(keys, indent=2))
            return 0
        for key in keys:
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

"""`toolreg config put|get|list|delete` (and the spec's `tg-*-config-item` aliases)."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from toolservice_base import ConfigClient, RequestTimeout
from toolservice_base.schemas import ConfigRequest
from toolservice_base.signing import load_private_key, sign_config_request

from .common import CommandError, Deadline, connect, fail, opened, waiting_for


def split_item(ref: str) -> tuple[str, str]:
    item_type, sep, key = ref.partition("/")
    if not sep or not item_type or not key:
        raise CommandError(f"expected TYPE/KEY, got {ref!r} (e.g. tool/tell-joke)")
    return item_type, key


def _signing_key(args: argparse.Namespace) -> Ed25519PrivateKey | None:
    """`--signing-key`: the operator's key each write is signed with; None without one."""
    path = getattr(args, "signing_key", None)
    return load_private_key(path) if path else None


def _signer(key: Ed25519PrivateKey | None, topicspace: str) -> Callable[[ConfigRequest], ConfigRequest] | None:
    """Each write signed with `key` for the topicspace it goes to (a store of another one refuses it)."""
    if key is None:
        return None
    return lambda request: sign_config_request(request, key, topicspace)


async def with_config(args: argparse.Namespace, action: Callable[[ConfigClient], Awaitable[int]]) -> int:
    """Run `action` on a config client; `--timeout` bounds it all, connecting to the broker included."""
    deadline = Deadline(args.timeout)
    key = _signing_key(args)
    async with AsyncExitStack() as stack:
        connection = await connect(args, deadline)
        stack.push_async_callback(connection.close)
        sign = _signer(key, connection.topics.topicspace)
        client = ConfigClient(connection, workspace=args.workspace, timeout=args.timeout, sign=sign)
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
            parsed, text = json.loads(value), False
        except ValueError:
            parsed, text = value, True
        if args.json:  # the value parsed when it is JSON (as most are), else its text
            print(json.dumps({"type": item_type, "key": key, "workspace": client.workspace, "value": parsed}, indent=2))
        else:
            print(value if text else json.dumps(parsed, indent=2))
        return 0

    return await with_config(args, get)


KNOWN_TYPES = ("tool", "tool-service")
"""The types the product itself reads and writes: listing one that is empty is no mistake."""


async def cmd_config_list(args: argparse.Namespace) -> int:
    async def listing(client: ConfigClient) -> int:
        keys = await client.list(args.type)
        if not keys and args.type not in KNOWN_TYPES:
            await _no_such_type(client, args.type)
        if getattr(args, "json", False):
            print(json.dumps(keys, indent=2))
            return 0
        for key in keys:
            print(key)
        return 0

    return await with_config(args, listing)


async def _no_such_type(client: ConfigClient, item_type: str) -> None:
    """`config list tols`: an empty answer for a type nothing holds is a typo more often than not; say which types
    the workspace has (a type TrustGraph or an operator uses is listed as soon as it holds an item)."""
    _, items = await client.config()
    there = sorted({*KNOWN_TYPES, *(t for t, values in items.items() if values)})
    if item_type in there:
        return
    close = difflib.get_close_matches(item_type, there, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise CommandError(
        f"no items of type {item_type!r} in workspace {client.workspace!r}, and no such type there: the types are"
        f" {', '.join(there)}{hint}"
    )


async def cmd_config_delete(args: argparse.Namespace) -> int:
    item_type, key = split_item(args.item)

    async def delete(client: ConfigClient) -> int:
        if not await client.get([(item_type, key)]):
            return fail(f"{item_type}/{key} not found in workspace {client.workspace!r}")
        version = await client.delete([(item_type, key)])
        print(f"{item_type}/{key} deleted (config version {version})")
        return 0

    return await with_config(args, delete)

"""Helpers for the big-store tests: many tools, and large items of an unrelated type."""

from __future__ import annotations

import json

from toolservice_base import ConfigClient

SERVICE = {
    "id": "bulk",
    "request-queue": "non-persistent://tg/request/bulk",
    "response-queue": "non-persistent://tg/response/bulk",
}
BLOB_BYTES = 3_500_000


def tool(n: int) -> str:
    """A tool of about 250 bytes, named so the names sort in number order."""
    return json.dumps(
        {
            "type": "tool-service",
            "name": f"t-{n:05d}",
            "service": "bulk",
            "description": (
                f"Look something up in collection number {n} of the archive, the way an agent would ask for it"
            ),
            "arguments": [{"name": "query", "type": "string", "description": "What to look up"}],
        }
    )


async def put_tools(config: ConfigClient, count: int, batch: int = 2_000) -> int:
    """`count` tools of the `bulk` service, written in batches (each put well under one message); returns the
    version."""
    version = await config.put([("tool-service", "bulk", json.dumps(SERVICE))])
    for start in range(0, count, batch):
        version = await config.put([("tool", f"t-{n:05d}", tool(n)) for n in range(start, min(count, start + batch))])
    return version


async def put_blobs(config: ConfigClient, count: int = 3) -> int:
    """`count` items of type `blob`, 3.5 MB each (one put each): 10 MB of unrelated items for three."""
    version = 0
    for n in range(count):
        version = await config.put([("blob", f"b{n}", chr(ord("a") + n) * BLOB_BYTES)])
    return version

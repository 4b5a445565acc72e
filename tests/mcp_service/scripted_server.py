"""A stdio MCP server written out by hand, line by line, to do on the wire what no well-behaved server does (run as a
script): say which request ids it was sent, wait to be cancelled, print lines that are no message, exit mid-call.

    python scripted_server.py SEEN    # SEEN: a file each `tools/call` id and each `notifications/cancelled` is added to

Tools: `whoami` answers with its request's id as JSON; `wait` answers only when cancelled (never: a cancelled request
is not answered); `garble` prints a line that is no JSON before its answer; `garble-answer` answers with a line that
has its id but is no JSON-RPC response; `malformed` answers with a result whose `content` is no list; `refuse`
answers with a JSON-RPC error; `die` exits the process while the others wait. It speaks the handshake
protocol (2025-11-25), standard library only.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

TOOLS = ["whoami", "wait", "garble", "garble-answer", "malformed", "refuse", "die"]


def send(message: dict[str, Any]) -> None:
    sys.stdout.buffer.write(json.dumps(message).encode() + b"\n")
    sys.stdout.buffer.flush()


def text(request_id: Any, value: str) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": value}]}})


class Server:
    def __init__(self, seen: str) -> None:
        self.seen = seen
        self.waiting: dict[Any, asyncio.Event] = {}

    def note(self, line: str) -> None:
        with open(self.seen, "a") as out:
            out.write(line + "\n")

    async def handle(self, message: dict[str, Any]) -> None:
        method, request_id, params = message.get("method"), message.get("id"), message.get("params") or {}
        if method == "initialize":
            send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "result": {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "scripted", "version": "1"},
                    },
                }
            )
        elif method == "tools/list":
            schema = {"type": "object", "properties": {}}
            tools = [{"name": name, "description": f"The {name} tool", "inputSchema": schema} for name in TOOLS]
            send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}})
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        elif method == "notifications/cancelled":
            self.note(f"cancelled {json.dumps(params.get('requestId'))} {params.get('reason')}")
            if (event := self.waiting.get(params.get("requestId"))) is not None:
                event.set()
        elif method == "tools/call":
            await self.call(request_id, params["name"])
        elif request_id is not None:  # server/discover among them: the client falls back to the handshake
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no method {method}"}})

    async def call(self, request_id: Any, name: str) -> None:
        self.note(f"call {json.dumps(request_id)} {name}")
        if name == "whoami":
            text(request_id, json.dumps(request_id))
        elif name == "wait":
            self.waiting[request_id] = asyncio.Event()
            await self.waiting[request_id].wait()
        elif name == "garble":
            sys.stdout.buffer.write(b"this is no JSON-RPC message\n")
            text(request_id, "answered after a line of garbage")
        elif name == "garble-answer":
            send({"jsonrpc": "2.0", "id": request_id, "outcome": "no result, no error"})
        elif name == "malformed":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"content": "not a list of blocks"}})
        elif name == "refuse":
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": "not today"}})
        elif name == "die":
            os._exit(3)


async def main() -> None:
    server = Server(sys.argv[1])
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: set[asyncio.Task[None]] = set()
    while line := await reader.readline():
        task = asyncio.create_task(server.handle(json.loads(line)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


if __name__ == "__main__":
    asyncio.run(main())

"""One replica in a process of its own, for the tests that kill -9 or SIGSTOP it.

    python election_proc.py URL TOPICSPACE REPLICA_ID [--token T] [--takeover-after S]

Competes for the store's lock (`Topics.state_lock`) with a `Membership`;
while active it writes `{"replica", "n"}` every 0.1 s through its elected
writer on `persistent://<topicspace>/state/proc-data`. It prints one JSON
line per event on stdout: `{"event": "role", "role", "term"}`,
`{"event": "wrote", "n"}`, `{"event": "write_failed", "error"}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from contextlib import AsyncExitStack

from discovery.replicas import ElectedWriter, Election, Membership
from toolservice_base import Settings, ToolDiscoveryError, open_transport


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


async def main(args: argparse.Namespace) -> None:
    settings = Settings(pulsar_url=args.url, broker="apache-pulsar", topicspace=args.topicspace, auth_token=args.token)
    data_topic = f"persistent://{args.topicspace}/state/proc-data"
    writer: list[ElectedWriter] = []
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(await open_transport(settings))
        members = await stack.enter_async_context(Membership(transport, args.replica_id, "store", interval=0.2))
        election = Election(
            transport,
            transport.topics.state_lock,
            args.replica_id,
            membership=members,
            takeover_after=args.takeover_after,
        )

        async def promoted() -> None:
            writer[:] = [await election.writer(data_topic)]

        async def demoted(reason: str) -> None:
            say(event="demoted", reason=reason)

        election.add_listener(promoted, demoted)
        await stack.enter_async_context(election)
        changes = asyncio.ensure_future(report(election))
        stack.callback(changes.cancel)
        n = 0
        while True:
            await asyncio.sleep(0.1)
            if not writer:
                continue
            n += 1
            try:
                await writer[0].send({"replica": args.replica_id, "n": n})
                say(event="wrote", n=n)
            except ToolDiscoveryError as exc:
                say(event="write_failed", error=type(exc).__name__)
                writer.clear()


async def report(election: Election) -> None:
    say(event="role", role=election.role, term=election.term)
    async for change in election.changes():
        say(event="role", role=change.role, term=change.term)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("topicspace")
    parser.add_argument("replica_id")
    parser.add_argument("--token")
    parser.add_argument("--takeover-after", type=float, default=10.0)
    try:
        asyncio.run(main(parser.parse_args()))
    except KeyboardInterrupt:
        sys.exit(0)

"""Self-announcement: announce, heartbeat, answer probes, withdraw.

A service's presence on the `tool-descriptors` topic is a lease: it lasts
`ttl` seconds past the last message. Heartbeats every `ttl / 3` keep it alive
through two lost messages; a probe from the registry (after a restart, or when
it meets a digest it does not know) gets a full `announce` back. A probe
carrying `refused` is the registry telling this instance that something it
sent was refused, and why: it is logged (`service.refused`).

A refused instance recovers by itself when the refusal shows that someone
else took its identity over (without a trust policy, the registry cannot
tell a forged message naming this instance from a real one): its sequence
memory was pushed past anything this instance sent, it was withdrawn by a
withdraw it never sent, or its id is bound to another workspace or service.
Then it takes a fresh instance id and announces again (`service.instance_renewed`),
so its lease, and its tools, live on. Any other refusal (a conflict, an
untrusted key, a replay of its own old message) is only logged: starting
again would change nothing, or hand a replayer a way to churn it. The
phrases the registry's refusals use for these cases are made here
(`replay_refusal`, `withdrawn_refusal`, `bound_refusal`), next to the test
that reads them (`judge_refusal`).

A registry of an older release reads a tool's `title`, `annotations`,
`input-schema` and `output-schema` as config values its service never
declared and refuses the announcement, without telling the sender (it
refuses a message it cannot parse before it knows who sent it); it only
keeps probing the instance, whose heartbeats it does not know. So an
instance whose full announce went unheard `UNHEARD` times in a row (each
time probed again for itself, within a few ttl) offers its *plain*
descriptors (those keys left off; the flat `arguments`, derived from the
input schema, stay), which that registry accepts: a rolling upgrade that
reaches services before registries loses no tool. Agents see the flat
arguments meanwhile, and the service still checks every call against its
full schema. The next probe for every service (a registry starting, an
upgraded one among them) is answered with the full descriptors again
(`service.plain_descriptors`, `service.full_descriptors`).

Each heartbeat carries, given a `CallStats`, the instance's call counters per
tool as the `tool-stats` message property (`call_stats`): outside the signed
body, so informational only, and ignored by registries of older releases.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Literal, Self

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from . import tracing
from .call_stats import CallStats
from .errors import TransportError
from .logs import get_logger
from .schemas import (
    Announcement,
    Probe,
    ToolDescriptor,
    ToolServiceDescriptor,
    descriptor_digest,
)
from .schemas.tools import MCP_FIELDS
from .signing import sign
from .tasks import cancel_and_wait
from .transport import Envelope, Publisher, Subscription, Transport, unique_name

log = get_logger("toolservice_base.announcer")


def new_instance_id(service_id: str) -> str:
    """A fresh id per process start (and per recovery), readable in `toolreg tools` output."""
    return f"{service_id[:100]}-{uuid.uuid4().hex[:12]}"


def replay_refusal(sequence: int, last: int) -> str:
    """The registry's reason for a message whose `sequence` is not after the `last` it remembers."""
    return f"sequence {sequence} is not after {last} (a replay or out of order)"


def withdrawn_refusal(instance: str) -> str:
    """The registry's reason for a message from an instance that withdrew."""
    return f"instance {instance} withdrew; nothing it sends is accepted again (a replay)"


def bound_refusal(instance: str, service: str, workspace: str, claimed_service: str, claimed_workspace: str) -> str:
    """The registry's reason for a message claiming a known instance for another service or workspace."""
    return (
        f"instance {instance} belongs to service {service!r} in workspace {workspace!r} while its lease lasts; "
        f"an unverified message may not announce it as service {claimed_service!r} in workspace {claimed_workspace!r}"
    )


_REPLAY = re.compile(r"sequence \d+ is not after (\d+) \(a replay")
_WITHDRAWN = re.compile(r"instance (\S+) withdrew; nothing it sends")
_BOUND = re.compile(r"instance (\S+) belongs to service '([^']*)' in workspace '([^']*)' while its lease lasts")


Verdict = Literal["takeover", "not-mine", "mine"]


def judge_refusal(
    refused: str, *, instance: str, sequence: int, service: str, workspace: str, withdrawn: bool = False
) -> tuple[Verdict, str]:
    """Whose message a refusal told to `instance` was, and what it shows: a verdict and why.

    `sequence` is the last this instance sent. `takeover`: someone else took
    its identity over, for the registry remembers a later sequence than it
    ever sent, saw a withdraw it never sent, or binds its id to another
    service or workspace; none of these can come from the instance itself.
    `not-mine`: the refused message was someone else's (a replay of one of its
    own old messages, or a forgery naming it elsewhere) and nothing of its
    own was touched. `mine`: anything else (a conflict, an untrusted key...).
    """
    if (found := _REPLAY.search(refused)) is not None:
        last = int(found.group(1))
        if last > sequence:
            return "takeover", f"the registry remembers sequence {last} of it, past its own {sequence}"
        return "not-mine", "a replay of one of its own earlier messages was refused"
    if (found := _WITHDRAWN.search(refused)) is not None and found.group(1) == instance:
        if withdrawn:
            return "mine", ""
        return "takeover", "the registry saw a withdraw of it that it never sent"
    if (found := _BOUND.search(refused)) is not None and found.group(1) == instance:
        bound = (found.group(2), found.group(3))
        if bound != (service, workspace):
            return "takeover", f"its id is bound to service {bound[0]!r} in workspace {bound[1]!r}"
        return "not-mine", "a message naming it for another service or workspace was refused"
    return "mine", ""


UNHEARD = 2
"""Full announces unheard in a row (each answered by a probe for this very instance) before the plain ones go."""


def plain_descriptors(tools: list[ToolDescriptor]) -> list[ToolDescriptor] | None:
    """`tools` without the keys beyond the spec, as an older registry accepts them; None if none has any."""
    if not any(tool.mcp_fields() for tool in tools):
        return None
    return [
        ToolDescriptor.model_validate({k: v for k, v in tool.to_wire().items() if k not in MCP_FIELDS})
        for tool in tools
    ]


class Announcer:
    """Keeps one instance's lease alive on the `tool-descriptors` topic."""

    def __init__(
        self,
        connection: Transport,
        service: ToolServiceDescriptor,
        tools: list[ToolDescriptor],
        *,
        ttl: float,
        workspace: str = "default",
        version: str = "",
        signing_key: Ed25519PrivateKey | None = None,
        instance: str | None = None,
        stats: CallStats | None = None,
    ) -> None:
        self._connection = connection
        self._stats = stats
        self._signing_key = signing_key
        self.service = service
        self.tools = tools
        self.full_tools = tools
        self._plain_tools = plain_descriptors(tools)
        self._unheard = 0
        self._last_asked = 0.0
        self.ttl = ttl
        self.workspace = workspace
        self.version = version
        self.instance = instance or new_instance_id(service.id)
        self.digest = descriptor_digest(service, tools)
        self.key = f"{workspace}/{service.id}"
        """Every message's key: one service's messages go to one consumer of a `Key_Shared` subscription
        (a registry sharded by service), and stay in order on a partitioned topic."""
        self._sequence = 0
        self._publisher: Publisher | None = None
        self._probes: Subscription | None = None
        self._scheduler: AsyncIOScheduler | None = None
        self._send_lock = asyncio.Lock()
        self._announced = False
        """`announce` ran: probes are answered, and `stop` withdraws."""
        self._beating: asyncio.Task[bool] | None = None
        self.withdrawn = False

    def _message(self, kind: Literal["announce", "heartbeat", "withdraw"]) -> Announcement:
        self._sequence += 1
        full = kind == "announce"
        return Announcement(
            kind=kind,
            instance=self.instance,
            sequence=self._sequence,
            sent_at=time.time(),
            ttl=self.ttl,
            workspace=self.workspace,
            digest=self.digest,
            service=self.service if full else None,
            tools=self.tools if full else None,
            version=self.version,
        )

    async def _send(self, kind: Literal["announce", "heartbeat", "withdraw"]) -> bool:
        if self._publisher is None:
            return False
        async with self._send_lock:  # sequence order on the wire = sequence order of numbers
            message = self._message(kind)
            if self._signing_key is not None:
                message = sign(message, self._signing_key)
            try:
                if kind == "heartbeat":  # the counters as the message is sent: their window ends with it
                    properties = self._stats.property() if self._stats is not None else None
                    await self._publisher.send(message.to_json(), properties=properties, key=self.key)
                else:  # announce and withdraw change the registry: a span, its traceparent on the message
                    with tracing.announcement(kind, self.service.id, self.instance) as properties:
                        await self._publisher.send(message.to_json(), properties=properties, key=self.key)
            except TransportError as exc:
                log.warning("announce.send_failed", kind=kind, service=self.service.id, error=str(exc))
                return False
        log.debug(
            "announce.sent", kind=kind, service=self.service.id, instance=self.instance, sequence=message.sequence
        )
        return True

    async def start(self) -> None:
        """Open, then announce (`DynamicToolService` opens while its request queue opens, and announces after)."""
        await self.open()
        await self.announce()

    async def open(self) -> None:
        """Open the producer on `tool-descriptors` and listen for probes, at once; nothing is sent yet.

        Listening before the first announce means a probe racing our start is
        never missed (it is answered by that announce). If one of the two
        fails, the other is kept for `stop` to close.
        """
        topics = self._connection.topics
        publisher, probes = await asyncio.gather(
            self._connection.publisher(topics.tool_descriptors),
            self._connection.subscribe(topics.tool_probe, self._on_probe, subscription=unique_name("probe")),
            return_exceptions=True,
        )
        if not isinstance(publisher, BaseException):
            self._publisher = publisher
        if not isinstance(probes, BaseException):
            self._probes = probes
        for failure in (publisher, probes):
            if isinstance(failure, BaseException):
                raise failure

    async def announce(self) -> None:
        """The first announce, then a heartbeat every ttl/3. Call once the service can take requests."""
        self._announced = True
        await self._send("announce")
        self._scheduler = AsyncIOScheduler()
        self._scheduler.add_job(
            self._beat,
            "interval",
            seconds=self.ttl / 3,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
        )
        self._scheduler.start()
        log.info(
            "service.announced",
            service=self.service.id,
            instance=self.instance,
            tools=[t.name for t in self.tools],
            ttl=self.ttl,
        )

    async def _beat(self) -> None:
        """Send a heartbeat, in a task of its own, unless the last one is still on its way.

        While the broker is away a send waits for its timeout, longer than a
        period: the next heartbeat is then skipped here, quietly (the send that
        gives up says so, `announce.send_failed`), not queued behind it to go
        out stale, and not left to the scheduler, which warns every period.
        """
        if self._beating is not None and not self._beating.done():
            return
        self._beating = asyncio.create_task(self._send("heartbeat"), name=f"heartbeat:{self.service.id}")

    async def _on_probe(self, message: Envelope) -> None:
        try:
            probe = Probe.model_validate_json(message.data)
        except (ValidationError, ValueError):
            log.debug("probe.ignored", reason="malformed")
            return
        if probe.refused is not None:  # a notice, not a request to re-announce
            if probe.instance == self.instance:
                verdict, why = judge_refusal(
                    probe.refused,
                    instance=self.instance,
                    sequence=self._sequence,
                    service=self.service.id,
                    workspace=self.workspace,
                    withdrawn=self.withdrawn,
                )
                if verdict == "not-mine":
                    log.info(
                        "service.refused_other",
                        service=self.service.id,
                        instance=self.instance,
                        reason=probe.refused,
                        note=why,
                    )
                    return
                log.warning("service.refused", service=self.service.id, instance=self.instance, reason=probe.refused)
                if verdict == "takeover" and not self.withdrawn:
                    await self._start_again(why)
            return
        if (
            probe.instance in (None, self.instance) and self._announced and not self.withdrawn
        ):  # before `announce`: it answers
            if probe.instance is None and self.tools is not self.full_tools:
                await self._offer(plain=False)
            elif probe.instance is not None and self._unheard_again():
                await self._offer(plain=True)
            else:
                await self._send("announce")

    def _unheard_again(self) -> bool:
        """A probe for this instance: its last announce went unheard. True when the plain descriptors should go."""
        if self._plain_tools is None or self.tools is not self.full_tools:
            return False
        now = time.monotonic()
        self._unheard = self._unheard + 1 if now - self._last_asked < 3 * self.ttl else 1
        self._last_asked = now
        return self._unheard >= UNHEARD

    async def _offer(self, *, plain: bool) -> None:
        """Announce the plain descriptors (for a registry of an older release) or the full ones again."""
        assert self._plain_tools is not None
        async with self._send_lock:
            self.tools = self._plain_tools if plain else self.full_tools
            self.digest = descriptor_digest(self.service, self.tools)
            self._unheard = 0
        log.warning(
            "service.plain_descriptors" if plain else "service.full_descriptors",
            service=self.service.id,
            instance=self.instance,
            note=(
                "the full descriptors went unheard (a registry of an older release refuses their title, annotations"
                " and schemas); announcing them without (agents get the flat arguments; calls are still checked"
                " against the full schema)"
                if plain
                else "announcing title, annotations and schemas again"
            ),
        )
        await self._send("announce")

    async def offer(self, tools: list[ToolDescriptor]) -> None:
        """Offer other tools from now on: announced at once if this instance has announced (a newer offer, which
        the registry merges as a change of definitions), and on every probe after."""
        async with self._send_lock:
            self.tools = self.full_tools = tools
            self._plain_tools = plain_descriptors(tools)
            self.digest = descriptor_digest(self.service, tools)
            self._unheard = 0
        if self._announced and not self.withdrawn:
            await self._send("announce")

    async def _start_again(self, why: str) -> None:
        """Someone took this instance's identity over: go on as a fresh instance, announcing at once."""
        async with self._send_lock:  # no message of the old id goes out after this
            previous, self.instance, self._sequence = self.instance, new_instance_id(self.service.id), 0
        log.warning(
            "service.instance_renewed",
            service=self.service.id,
            instance=self.instance,
            previous=previous,
            reason=why,
            note="another sender used this instance's id; announcing again under a fresh one",
        )
        await self._send("announce")

    async def withdraw(self) -> None:
        """Tell the registry we are going, before the request consumer closes."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        await cancel_and_wait(self._beating)  # a heartbeat waiting on the broker is moot now
        if not self.withdrawn and self._announced:
            self.withdrawn = True
            await self._send("withdraw")
            log.info("service.withdrawn", service=self.service.id, instance=self.instance)

    async def stop(self) -> None:
        await self.withdraw()
        if self._probes is not None:
            await self._connection.unsubscribe(self._probes)
            self._probes = None
        if self._publisher is not None:
            await self._connection.close_publisher(self._publisher)
            self._publisher = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

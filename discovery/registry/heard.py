"""What a standby registry hears while another one runs: so a takeover starts with warm leases, not a ttl of grace.

A registry that starts cold gives every instance its ownership records name
one ttl of grace: it heard nothing before, so it cannot tell a live instance
from one that died while no registry listened. A standby (of a registry
group, or a standby replica of `toolreg up --store pulsar`) has no such
excuse: the announcements reach it as they reach the active one. So it
listens, on a subscription of its own, and keeps when it last heard each
instance. Elected, its registry restores each recorded lease from that
(`Registry(heard=...)`): an instance heard from runs out one ttl after its
last message, as it would have at the deposed registry; one recorded but
never heard runs out one ttl after the standby began to listen. A service
that died during the failover goes as soon as its lease truly ends, and no
live one is lost: whatever this table cannot vouch for falls back to the
grace a cold start gives.

What is heard here is not checked as the registry checks it (that needs its
lease table and trust policy), and it need not be: a heard time only ever
brings a lease's end *earlier* than grace would put it, never later, so a
forged or refused message gains nothing a registry restart would not give
anyway. Withdrawals are not acted on; a withdrawn instance is silent since,
and runs out one ttl after its last message.

The table is only as good as the listening: while the subscription is
disconnected, or the process was not running (a freeze), nothing was heard
that should have been, so listening starts over from when it is back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from pydantic import ConfigDict, Field, ValidationError

from toolservice_base.logs import get_logger
from toolservice_base.schemas import DEFAULT_TTL, MAX_MESSAGE_BYTES, NAME_PATTERN, WireModel
from toolservice_base.tasks import cancel_and_wait
from toolservice_base.transport import Envelope, Subscription, Transport, unique_name

log = get_logger("discovery.registry")

CHECK_EVERY = 0.5
"""Seconds between two looks at the subscription: a disconnection is noticed (and listening restarted) this late at
most."""
FROZEN = 3.0
"""A gap this long between two looks: the process did not run, so what it should have heard meanwhile is lost."""


class HeardMessage(WireModel):
    """The part of an announcement (any kind) a standby keeps: who spoke, for which workspace, with what ttl."""

    model_config = ConfigDict(extra="ignore")

    kind: str
    instance: str = Field(pattern=NAME_PATTERN)
    ttl: float = Field(default=DEFAULT_TTL, gt=0, le=3600)
    workspace: str = Field(default="default", pattern=NAME_PATTERN)


@dataclass(frozen=True)
class Heard:
    """When an instance was last heard (monotonic and wall clock), and the ttl it declared then."""

    at: float
    wall: float
    workspace: str
    ttl: float


class HeardLeases:
    """A standby's ear on `tool-descriptors`: the last time each instance spoke. `start()`, `stop()`, again after a
    demotion."""

    def __init__(self, connection: Transport, *, capacity: int, receiver_queue: int, linger: float = 0.0) -> None:
        self._connection = connection
        self._linger = linger
        self.capacity = capacity
        """At most this many instances are kept (the registry's `max_instances`): a flood of made-up ids cannot grow
        it."""
        self._receiver_queue = receiver_queue
        self._heard: dict[str, Heard] = {}
        self._subscription: Subscription | None = None
        self._watch: asyncio.Task[None] | None = None
        self._since: float | None = None
        self._full_said = False

    def __len__(self) -> int:
        return len(self._heard)

    @property
    def listening_since(self) -> float | None:
        """Monotonic time since when every message on the topic reached this table; None: not listening now."""
        return self._since

    async def start(self) -> None:
        """Listen from now on (what was heard before a stop is forgotten: it may be stale)."""
        if self._subscription is not None:
            return
        self._heard.clear()
        topic = self._connection.topics.tool_descriptors
        self._subscription = await self._connection.subscribe(
            topic,
            self._on_message,
            subscription=unique_name("tool-registry-standby"),
            receiver_queue=self._receiver_queue,
            linger=self._linger,
        )
        self._since = time.monotonic()
        self._watch = asyncio.create_task(self._keep_watch(), name="registry:standby-ear")
        log.info("registry.standby_listening", topic=topic)

    async def stop(self) -> None:
        """Stop listening (the registry of this process took over, or it is closing). Safe twice, and before `start`."""
        self._since = None
        if self._watch is not None:
            watch, self._watch = self._watch, None
            await cancel_and_wait(watch)
        if self._subscription is not None:
            subscription, self._subscription = self._subscription, None
            await self._connection.unsubscribe(subscription)

    def restore_expiry(
        self, instance: str, workspace: str, ttl: float, now: float
    ) -> tuple[float, float | None] | None:
        """When a recorded lease ends by what was heard, and the wall clock it was last heard at; None: cannot tell
        (grace).

        Never later than `now + ttl` (what grace gives), whatever was heard;
        never earlier than one ttl after listening (re)started, as an
        instance may not have spoken since.
        """
        since = self._since
        if since is None:
            return None
        heard = self._heard.get(instance)
        if heard is not None and heard.workspace == workspace:
            return min(max(heard.at, since) + heard.ttl, now + ttl), heard.wall
        return min(since + ttl, now + ttl), None

    async def _on_message(self, message: Envelope) -> None:
        if len(message.data) > MAX_MESSAGE_BYTES:
            return
        try:
            said = HeardMessage.model_validate_json(message.data)
        except ValidationError:
            return  # garbage: the active registry refuses it, and tells the sender
        known = said.instance in self._heard
        if not known and len(self._heard) >= self.capacity and not self._make_room(time.monotonic()):
            return
        self._heard[said.instance] = Heard(time.monotonic(), time.time(), said.workspace, said.ttl)

    def _make_room(self, now: float) -> bool:
        """Forget instances whose lease would have run out; False if none would (the table is full of live ones)."""
        for instance in [i for i, heard in self._heard.items() if heard.at + heard.ttl < now]:
            del self._heard[instance]
        if len(self._heard) < self.capacity:
            return True
        if not self._full_said:
            self._full_said = True
            log.warning(
                "registry.standby_table_full",
                instances=len(self._heard),
                note="more live instances than --max-instances: the ones beyond get a ttl of grace at a takeover",
            )
        return False

    async def _keep_watch(self) -> None:
        """Restart listening from now after a disconnection or a freeze: what went unheard meanwhile must not count as
        silence."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(CHECK_EVERY)
            now = time.monotonic()
            connected = self._subscription is not None and self._subscription.connected
            if not connected or now - last > FROZEN:
                if self._since is not None:
                    log.info(
                        "registry.standby_deaf",
                        reason="disconnected" if not connected else "not running",
                        note="listening again from when it is back",
                    )
                self._since = None
            elif self._since is None:
                self._since = now
            last = now

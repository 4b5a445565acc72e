"""Checking what arrives on `tool-descriptors` before it can touch the store.

Anyone who can publish on the topic can send anything, so every message is
judged here first (spec section 8): size, shape (the pydantic
`Announcement`, which already checks names, lengths, the digest and each
tool against its service; and no two of its tools listed to MCP and OpenAI
clients under one name or names that look alike, `toolservice_base.names`), queues in an allowed set
of namespaces, and freshness (`sent-at` inside the skew window, no
`sequence` that is not after the last one seen from the instance). Then the
registry's `authorize` (an instance keeps the workspace and service of its
lease; the trust policy), before the sequence is recorded. A refusal is a
`Rejected` carrying a one-line reason; the registry logs it and keeps it in
a bounded list.

The skew window is what stops a replay once the sequence memory has
forgotten the instance (eviction): a message is refused when its `sent-at`
is more than `max_skew` seconds ahead of the registry's clock, or older than
its own ttl or `max_skew`, whichever is shorter (a message older than its
ttl could not keep a lease alive anyway). Inside the window, an instance
that withdrew is refused outright (`ended`): a real instance never speaks
after its withdraw, so anything later is a replay. The registry keeps those
instances in the store (`departed`), so a restart does not forget them.

Repeated rejections of one sender are one entry of the `RejectionLog`
(count, first, last), so a chatty refused service cannot push every other
entry out of it.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError

from toolservice_base.announcer import replay_refusal, withdrawn_refusal
from toolservice_base.names import client_name, name_keys
from toolservice_base.schemas import (
    MAX_MESSAGE_BYTES,
    Announcement,
    describe_validation_error,
    printable,
    queue_namespace,
)
from toolservice_base.topics import DEFAULT as DEFAULT_TOPICS

from .protocol import Rejection

DEFAULT_NAMESPACES = DEFAULT_TOPICS.queue_namespaces
SEQUENCE_MEMORY = 10_000
DEFAULT_MAX_SKEW = 30.0
"""Seconds a sender's clock may differ from the registry's (NTP-synced hosts differ by milliseconds)."""
EXCERPT = 160


Authorize = Callable[[Announcement], "str | None"]
"""Returns None to accept an announcement, or the reason it is not trusted. It may instead raise
`Rejected` itself, for a refusal of another category (`identity`)."""


class NamedKey(Protocol):
    """A trusted key as the registry shows it: by the name the trust policy gives it."""

    @property
    def name(self) -> str: ...

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The key itself: the registry hands it to callers (a service's `answer-key`) to check its answers."""
        ...


class TrustCheck(Protocol):
    """What the registry needs of a trust policy (`discovery.registry.trust.TrustPolicy` is one)."""

    @property
    def keys(self) -> Mapping[str, NamedKey]:
        """Key id -> the key, for every key the policy trusts."""
        ...

    @property
    def path(self) -> Path | None:
        """The file the policy was read from; None for one built in code."""
        ...

    @property
    def pin_definitions(self) -> bool:
        """The policy asks for pinned definitions (as `--pin-definitions`)."""
        ...

    @property
    def auto_approve(self) -> str | None:
        """Which held definitions are approved without an operator (`RegistryOptions.auto_approve`)."""
        ...

    def check(
        self, announcement: Announcement, service_id: str | None, tool_names: list[str], workspace: str | None = None
    ) -> str | None:
        """None to accept; else the reason. `service_id` None: only the signature is judged;
        `workspace` None: the workspace the announcement names."""
        ...

    def signed_by(self, announcement: Announcement, key_id: str) -> bool:
        """True when `announcement` carries a valid signature by the trusted key `key_id`."""
        ...


Category = Literal[
    "too-large", "malformed", "namespace", "stale", "replay", "identity", "untrusted", "capacity", "store", "definition"
]
TAKEOVER: frozenset[str] = frozenset({"replay", "identity"})
"""Refusals a real instance gets when another sender took its id over (its sequence memory pushed ahead,
a forged withdraw, its id bound elsewhere): the registry tells the instance, whose announcer tells a takeover
from someone else's replay (`toolservice_base.announcer.judge_refusal`) and starts again under a fresh id."""
FRESHNESS: frozenset[str] = frozenset({"stale", *TAKEOVER})
"""Refusals that say nothing about whether the lease's holder lives: a replay of an old message, a clock
(the sender's, or the registry's own) out of step, or a message claiming a known instance for another
workspace or service (its holder never does that: someone else sent it). They never make a lease count as refused."""


class Rejected(ValueError):
    """A message the registry refuses; `str()` is the reason.

    `announcement` is the parsed message when it got that far, so the
    registry can tell whether the refusal came from the lease's own holder;
    its workspace is the refusal's (`toolreg rejections --workspace`).
    """

    def __init__(
        self,
        reason: str,
        *,
        instance: str | None = None,
        service: str | None = None,
        category: Category = "malformed",
        announcement: Announcement | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.instance = instance
        self.service = service
        self.category = category
        self.announcement = announcement
        self.workspace = announcement.workspace if announcement is not None else None


def excerpt(data: bytes, limit: int = EXCERPT) -> str:
    text = data[:limit].decode("utf-8", errors="replace")
    return text + ("…" if len(data) > limit else "")


_INSTANCE = re.compile(rb'"instance"\s*:\s*"([A-Za-z0-9_.-]{1,128})"')
_SERVICE_ID = re.compile(rb'"service"\s*:\s*\{[^{}]*?"id"\s*:\s*"([A-Za-z0-9_.-]{1,128})"')


def _guess_ids(data: bytes) -> tuple[str | None, str | None]:
    """Best-effort instance and service of a refused message, for the operator.

    A pattern search, not a parse: it must also work on a message refused
    for being too large (or too deep) to parse.
    """
    head = data[:MAX_MESSAGE_BYTES]
    instance, service = _INSTANCE.search(head), _SERVICE_ID.search(head)
    return (instance.group(1).decode() if instance else None), (service.group(1).decode() if service else None)


def _client_clash(names: list[str]) -> str | None:
    """Why one service's tools cannot all be listed to clients (two share a `client_name`, or look alike:
    `name_keys`), or None."""
    seen: dict[str, str] = {}
    for name in sorted(names):
        shown = client_name(name)
        for key in sorted(name_keys(name)):
            other = seen.get(key)
            if other is None or other == name:
                continue
            if client_name(other) == shown:
                return (
                    f"not a valid announcement: tools {other!r} and {name!r} would both be listed to MCP and OpenAI"
                    f" clients as {shown!r}; rename one"
                )
            return (
                f"not a valid announcement: tools {other!r} and {name!r} look alike to MCP and OpenAI clients (they"
                " differ only in case, lookalike characters, spaces or separators); rename one"
            )
        for key in name_keys(name):
            seen.setdefault(key, name)
    return None


class AnnouncementValidator:
    """Parses and judges announcements; remembers each instance's last sequence.

    The sequence memory is bounded (least recently heard instances forgotten
    first), so a flood of fake instance ids cannot grow it without limit.
    """

    def __init__(
        self,
        allowed_namespaces: Iterable[str] = DEFAULT_NAMESPACES,
        *,
        max_bytes: int = MAX_MESSAGE_BYTES,
        memory: int = SEQUENCE_MEMORY,
        max_skew: float = DEFAULT_MAX_SKEW,
    ) -> None:
        if not max_skew > 0:
            raise ValueError("max_skew must be positive")
        self.allowed_namespaces = frozenset(allowed_namespaces)
        self.max_bytes = max_bytes
        self.max_skew = max_skew
        self._memory = memory
        self._last_sequence: OrderedDict[str, int] = OrderedDict()
        self._ended: OrderedDict[str, float] = OrderedDict()
        """Instances that withdrew -> wall clock until which anything from them is refused."""

    def ended(self, instance: str, sequence: int, until: float) -> None:
        """`instance` withdrew after `sequence`: refuse everything from it until `until`.

        After `until` its messages are stale anyway. Bounded like the sequence
        memory (soonest-forgotten first).
        """
        self._ended[instance] = max(until, self._ended.get(instance, until))
        self._ended.move_to_end(instance)
        while len(self._ended) > self._memory:
            self._ended.popitem(last=False)
        self._remember(instance, sequence)

    def _remember(self, instance: str, sequence: int) -> None:
        self._last_sequence[instance] = max(sequence, self._last_sequence.get(instance, sequence))
        self._last_sequence.move_to_end(instance)
        while len(self._last_sequence) > self._memory:
            self._last_sequence.popitem(last=False)

    def _parse(self, data: bytes) -> Announcement:
        """The announcement `data` holds, or `Rejected` (too large, or not one), naming its sender where it can."""
        if len(data) > self.max_bytes:
            instance, service = _guess_ids(data)
            raise Rejected(
                f"message is {len(data)} bytes; the limit is {self.max_bytes}",
                instance=instance,
                service=service,
                category="too-large",
            )
        try:
            return Announcement.model_validate_json(data)
        except ValidationError as exc:
            instance, service = _guess_ids(data)
            raise Rejected(
                f"not a valid announcement: {describe_validation_error(exc)}", instance=instance, service=service
            ) from None
        except ValueError as exc:  # e.g. recursion limits inside the JSON parser
            raise Rejected(f"not a valid announcement: {printable(str(exc))}") from None

    def check(self, data: bytes, now: float, authorize: Authorize | None = None) -> Announcement:
        """The parsed announcement, or `Rejected` saying why not. `now` is wall-clock seconds.

        `authorize` (the registry's: an instance keeps its workspace and
        service, and the trust policy when one is configured) runs before the
        instance's sequence is recorded, so a message it refuses cannot push a
        real instance's sequence forward and lock it out.
        """
        announcement = self._parse(data)
        service_id = announcement.service.id if announcement.service else None

        def refuse(reason: str, category: Category) -> Rejected:
            return Rejected(
                reason, instance=announcement.instance, service=service_id, category=category, announcement=announcement
            )

        if announcement.service is not None:
            for queue in (announcement.service.request_queue, announcement.service.response_queue):
                namespace = queue_namespace(queue)
                if namespace not in self.allowed_namespaces:
                    allowed = ", ".join(sorted(self.allowed_namespaces))
                    raise refuse(f"queue {queue} is outside the allowed namespaces ({allowed})", "namespace")
        if announcement.tools:
            clash = _client_clash([tool.name for tool in announcement.tools])
            if clash is not None:
                raise refuse(clash, "malformed")
        ahead = announcement.sent_at - now
        if ahead > self.max_skew:
            raise refuse(
                f"stale: sent-at is {ahead:.1f}s ahead of the registry's clock, more than the allowed skew of"
                f" {self.max_skew:g}s (a forged time, or the sender's clock is ahead)",
                "stale",
            )
        window = min(announcement.ttl, self.max_skew)
        if -ahead > window:
            limit = (
                f"its ttl of {announcement.ttl:g}s"
                if announcement.ttl <= self.max_skew
                else f"the allowed skew of {self.max_skew:g}s"
            )
            raise refuse(
                f"stale: sent {-ahead:.1f}s ago, more than {limit} (a replay, or the sender's clock is behind)", "stale"
            )
        until = self._ended.get(announcement.instance)
        if until is not None and now < until:
            raise refuse(withdrawn_refusal(announcement.instance), "replay")
        last = self._last_sequence.get(announcement.instance)
        if last is not None and announcement.sequence <= last:
            raise refuse(replay_refusal(announcement.sequence, last), "replay")
        if authorize is not None:
            refusal = authorize(announcement)
            if refusal:
                raise refuse(f"not trusted: {refusal}", "untrusted")
        self._remember(announcement.instance, announcement.sequence)
        return announcement


_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


class RejectionLog:
    """The most recent rejections, least recently repeated first, at most `limit` of them.

    A rejection of a sender already in the log (same instance and reason,
    numbers aside: "sent 31.2s ago" and "sent 40.5s ago" are one reason)
    updates that entry (`count`, `at` = the last) instead of adding one; its
    service is kept from whichever message named it (heartbeats do not).
    Rejections naming no instance are merged when service and reason are
    the same text. Rejections in different workspaces are never merged:
    `toolreg rejections --workspace` shows each workspace its own.
    """

    def __init__(self, limit: int = 200) -> None:
        self._items: OrderedDict[tuple[str | None, str | None, str | None, str], Rejection] = OrderedDict()
        self._limit = limit
        self.total = 0

    def add(self, rejection: Rejection) -> bool:
        """Record it; True when it is a new entry, False when it repeats one."""
        self.total += 1
        key: tuple[str | None, str | None, str | None, str]
        if rejection.instance is None:
            key = (None, rejection.service, rejection.workspace, rejection.reason)
        else:
            key = (rejection.instance, None, rejection.workspace, _NUMBERS.sub("#", rejection.reason))
        known = self._items.pop(key, None)
        if known is not None:
            rejection = rejection.model_copy(
                update={
                    "count": known.count + rejection.count,
                    "first": known.first,
                    "service": rejection.service or known.service,
                }
            )
        elif rejection.first is None:
            rejection = rejection.model_copy(update={"first": rejection.at})
        self._items[key] = rejection
        while len(self._items) > self._limit:
            self._items.popitem(last=False)
        return known is None

    def items(self) -> list[Rejection]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

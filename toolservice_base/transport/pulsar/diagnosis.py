"""Why the broker will not let us use a topic, asked of the broker itself.

pulsar-client hides the answer from a running process. Measured on Apache
Pulsar 4.0.8 with pulsar-client 3.13: when a role's permission on a
namespace is revoked, or the namespace is deleted, the broker closes every
producer and consumer there, and the client's reconnects are refused
(`AuthorizationError` or `TopicNotFound` on the lookup) in its own log only;
when a token expires, the broker drops the connection and refuses every new
handshake. In each case a send ends in `Timeout` after its send timeout, a
receive simply waits, and `is_connected()` is False: nothing says why. Two
quick questions do:

- a handshake of our own: one CONNECT frame, the Pulsar protocol's first
  exchange, on a fresh TCP connection. The broker answers CONNECTED, or an
  `AuthenticationError` for a token it refuses (missing, wrong or expired),
  within milliseconds (measured);
- once the handshake passes, a lookup of the topic on the client's own
  connection (`transport.pulsar` asks it): `AuthorizationError` (the role may
  not use the namespace; to a role that is not a superuser Apache Pulsar says
  the same for a namespace that does not exist, measured), `TopicNotFound`
  (no such namespace), or an answer.

The token's own claims (`sub`, the role; `exp`, when it expires) are read,
never verified, to name the role and the time in the message. `TopicWatch`
asks these questions for a process's consumers and producers while they are
disconnected, logs the answer, and keeps it for readiness checks; the client
goes on reconnecting by itself, so a grant or a new namespace heals it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ...errors import AuthenticationFailed, NamespaceMissing, NotAuthorized, TokenExpired, TransportError
from ...logs import get_logger
from ...schemas import queue_namespace

log = get_logger("toolservice_base.transport")

HANDSHAKE_TIMEOUT = 2.0
"""Seconds a handshake may take: a broker answers one in milliseconds (measured on loopback, 4.0.8 and pulsar-lite)."""
GRACE = 1.0
"""Seconds a consumer or producer may be disconnected before we ask why: a topic that moves, or a broker that
restarts at once, reconnects within about 0.1 s (measured), and is not worth a log line."""
WATCH_INTERVAL = 1.0
RECHECK = 5.0
"""While a topic stays unusable, it is asked about again this often; a line is logged only when the answer changes."""
TOKEN_FIX = "PULSAR_AUTH_TOKEN or PULSAR_AUTH_TOKEN_FILE"
MAX_FRAME = 64 * 1024

# The Pulsar protocol (PulsarApi.proto): BaseCommand.type values and fields, CommandConnect fields, ServerError values.
_CONNECT, _CONNECTED, _ERROR = 2, 3, 14
_PROTOCOL_VERSION = 21
_AUTHENTICATION_ERROR = 3
_SERVER_ERRORS = {
    _AUTHENTICATION_ERROR: "AuthenticationError",
    4: "AuthorizationError",
    6: "ServiceNotReady",
    10: "UnsupportedVersionError",
}


# --- the token's claims -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claims:
    """What a token says of itself (unverified): the role it names, and when it expires (seconds since the epoch)."""

    role: str | None = None
    expires: float | None = None

    @classmethod
    def of(cls, token: str | None) -> "Claims":
        """The claims of a JWT (what Apache Pulsar's token authentication uses); empty for anything else."""
        if not token or token.count(".") != 2:
            return cls()
        payload = token.split(".")[1]
        try:
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (ValueError, UnicodeDecodeError):
            return cls()
        if not isinstance(claims, dict):
            return cls()
        role, expires = claims.get("sub"), claims.get("exp")
        return cls(
            role=role if isinstance(role, str) and role else None,
            expires=float(expires) if isinstance(expires, int | float) and not isinstance(expires, bool) else None,
        )

    def expired(self, now: float | None = None) -> bool:
        return self.expires is not None and self.expires <= (time.time() if now is None else now)


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


# --- the errors, each naming the cause and the fix ----------------------------------------------------------------


def token_refused(
    url: str, token: str | None, said: str, *, doing: str | None = None, now: float | None = None
) -> AuthenticationFailed:
    """The broker refused our token at the handshake: none sent, expired (by its own `exp`), or not valid."""
    where = f" while {doing}" if doing else ""
    fix = f"set {TOKEN_FIX} to a token of the role this kind of process runs as"
    if not token:
        return AuthenticationFailed(
            f"the broker at {url} refused the token in PULSAR_AUTH_TOKEN{where} (none set, so no role; it said {said}):"
            f" {fix}"
        )
    claims = Claims.of(token)
    role = f"role {claims.role}" if claims.role else "it names no role"
    if claims.expires is not None and claims.expired(now):
        return TokenExpired(
            f"the token expired at {_when(claims.expires)} ({role}), and the broker at {url} refuses it now{where}:"
            f" give the process a fresh token ({TOKEN_FIX}) and restart it",
            expired_at=claims.expires,
        )
    return AuthenticationFailed(
        f"the broker at {url} refused the token in PULSAR_AUTH_TOKEN{where} ({role}; it said {said}): it is not signed "
        f"with this cluster's key, or is malformed; {fix}"
    )


def not_authorized(url: str, namespace: str, role: str | None, *, doing: str | None = None) -> NotAuthorized:
    """The broker took our token, but its role may not use `namespace` (or, as it tells a role that is no superuser, it
    is gone)."""
    who = role or "<role>"
    where = f"{doing}: " if doing else ""
    return NotAuthorized(
        f"not authorized on {namespace} for role {role or '(the token names none)'} ({where}AuthorizationError from"
        f" {url}): if this kind of process should, grant its role what the kind needs there (`toolreg init --topicspace"
        f" {namespace.split('/')[0]}` grants each kind its own, as deploy/pulsar-init.sh with TOOLREG_<KIND>_ROLE; or"
        f" `pulsar-admin namespaces grant-permission {namespace} --role {who} --actions produce,consume`), or create"
        " the namespace if it was deleted",
        namespace=namespace,
        role=role,
    )


def subscription_reserved(url: str, namespace: str, subscription: str, role: str | None) -> NotAuthorized:
    """The role may consume in `namespace`, but not through `subscription`: reserved for other roles there."""
    who = role or "<role>"
    return NotAuthorized(
        f"role {role or '(the token names none)'} may consume on {namespace} but not through subscription"
        f" {subscription!r}, which the namespace reserves for other roles (AuthorizationError from {url}): run this"
        f" process with the role the subscription is for (deploy/pulsar-init.sh reserves config-store and"
        f" tool-registry for TOOLREG_STORE_ROLE), or `pulsar-admin namespaces grant-subscription-permission"
        f" {namespace} --subscription {subscription} --roles {who}` if this role should serve it",
        namespace=namespace,
        role=role,
    )


def namespace_missing(url: str, namespace: str, *, doing: str | None = None) -> NamespaceMissing:
    """The broker says the namespace does not exist: never created, or deleted."""
    where = f" ({doing})" if doing else ""
    return NamespaceMissing(
        f"the broker at {url} has no namespace {namespace}{where}: it does not exist, or was deleted; create it "
        f"(`toolreg init --topicspace {namespace.split('/')[0]}` does, as deploy/pulsar-init.sh with"
        " TOOLREG_TOPICSPACE) or set TOOLREG_TOPICSPACE to a tenant that has the product's namespaces",
        namespace=namespace,
    )


def refusal(error: TransportError | None) -> bool:
    """Whether `error` is one only an operator can clear (a token, a grant, a namespace): sending on cannot help."""
    return isinstance(error, AuthenticationFailed | NamespaceMissing)


# --- the handshake ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """How the broker answered our handshake: `accepted` True, False (it refused our token), or None (no verdict).

    `silent`: it accepted the TCP connection but said nothing in time (not a Pulsar broker, or a stuck one).
    """

    accepted: bool | None
    said: str = ""
    silent: bool = False


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def connect_frame(token: str | None) -> bytes:
    """A CONNECT command frame: what a client sends first, with our token if we have one."""
    connect = _field(1, b"toolreg-diagnosis") + _field(4, _PROTOCOL_VERSION)
    if token:
        connect += _field(3, token.encode()) + _field(5, b"token")
    command = _field(1, _CONNECT) + _field(2, connect)
    return struct.pack(">II", len(command) + 4, len(command)) + command


def _fields(data: bytes) -> dict[int, int | bytes]:
    """The fields of one protobuf message (the last of each number wins; enough for the few read here)."""
    found: dict[int, int | bytes] = {}
    at = 0

    def varint() -> int:
        nonlocal at
        value = shift = 0
        while True:
            if at >= len(data) or shift > 63:
                raise ValueError("truncated varint")
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while at < len(data):
        key = varint()
        number, kind = key >> 3, key & 7
        if kind == 0:
            found[number] = varint()
        elif kind == 2:
            size = varint()
            found[number], at = data[at : at + size], at + size
        elif kind in (1, 5):
            at += 8 if kind == 1 else 4
        else:
            raise ValueError(f"wire type {kind}")
    return found


def read_answer(command: bytes) -> Answer:
    """The broker's answer to CONNECT, from the BaseCommand it sent back."""
    fields = _fields(command)
    kind = fields.get(1)
    if kind == _CONNECTED:
        return Answer(True)
    error = fields.get(_ERROR)
    if kind == _ERROR and isinstance(error, bytes):
        detail = _fields(error)
        code, message = detail.get(2), detail.get(3)
        name = _SERVER_ERRORS.get(code, f"error {code}") if isinstance(code, int) else "an error"
        text = message.decode(errors="replace") if isinstance(message, bytes) else ""
        said = f"{name}: {text}" if text else name
        return Answer(
            False if code == _AUTHENTICATION_ERROR else None, said
        )  # another error is no verdict on the token
    return Answer(None, f"command type {kind!r}")


def _addresses(url: str) -> list[tuple[str, int]]:
    _, _, rest = url.partition("://")
    found = []
    for address in rest.split("/")[0].split(","):
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            host, port = address, "6650"
        found.append((host.strip("[]") or "localhost", int(port)))
    return found


async def handshake(url: str, token: str | None, timeout: float = HANDSHAKE_TIMEOUT) -> Answer:
    """Connect to the broker and present `token` as a client does; the broker's verdict, or None if it gave none in
    time.

    Plain `pulsar://` only: over TLS the answer is None, and the lookup alone decides.
    """
    if not url.startswith("pulsar://"):
        return Answer(None, "not a plain pulsar:// URL")
    why, silent = "no address", False
    for host, port in _addresses(url):
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port)
                try:
                    writer.write(connect_frame(token))
                    await writer.drain()
                    total = struct.unpack(">I", await reader.readexactly(4))[0]
                    if not 4 <= total <= MAX_FRAME:
                        return Answer(None, f"a {total}-byte frame")
                    frame = await reader.readexactly(total)
                    size = struct.unpack(">I", frame[:4])[0]
                    return read_answer(frame[4 : 4 + size])
                finally:
                    writer.close()
        except TimeoutError:
            why, silent = f"gave no answer to a handshake within {timeout:g}s", True
        except (OSError, asyncio.IncompleteReadError, ValueError, struct.error) as exc:
            why, silent = f"the handshake failed ({type(exc).__name__})", False
    return Answer(None, why, silent)


def _namespace(topic: str) -> str:
    try:
        return queue_namespace(topic)
    except ValueError:
        return topic


# --- watching a process's consumers and producers -----------------------------------------------------------------


Action = Literal["produce", "consume"]


class Watched(Protocol):
    """A consumer or producer: its topic, what it does there, and whether it is connected to the broker now."""

    topic: str
    action: Action

    @property
    def connected(self) -> bool: ...


@dataclass
class _Down:
    since: float
    next_check: float = 0.0
    error: TransportError | None = None
    reason: str | None = None


@dataclass
class TopicWatch:
    """Finds, logs and keeps why a topic's consumers or producers stay disconnected, until they are back.

    `handles` lists what to watch; `broker` asks about the broker as a whole
    (reachable, and our token accepted) and `ask` about one topic and action
    (our role allowed to produce or consume there, its namespace there). A
    topic is asked about once it has been down for `GRACE`, again every
    `RECHECK` while it stays down, and a warning (`topic.unavailable`, the
    reason and the topics it holds for) is logged whenever the answer
    changes; `topic.available` when every handle on a topic is back.
    """

    url: str
    handles: Callable[[], Iterable[Watched]]
    broker: Callable[[], Awaitable[TransportError | None]]
    ask: Callable[[str, Action], Awaitable[TransportError | None]]
    _down: dict[str, _Down] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="transport:topic-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    def problem(self, topic: str) -> str | None:
        """Why a consumer or producer on `topic` is not connected, once it has been down for `GRACE`; else None."""
        if all(handle.connected for handle in self.handles() if handle.topic == topic):
            return None
        down = self._down.get(topic)
        return None if down is None else down.reason

    def refusal(self, topic: str) -> TransportError | None:
        """What keeps `topic` unusable until an operator acts (see `refusal`), while it is down; else None."""
        down = self._down.get(topic)
        return down.error if down is not None and refusal(down.error) else None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            try:
                await self.check(time.monotonic())
            except Exception:
                log.exception("topic.watch_failed", url=self.url)

    async def check(self, now: float) -> None:
        """One look at every handle: forget topics that are back, ask about those down past `GRACE`."""
        down: dict[str, set[Action]] = {}
        for handle in self.handles():
            if not handle.connected:
                down.setdefault(handle.topic, set()).add(handle.action)
        back = [topic for topic in self._down if topic not in down]
        for topic in back:
            gone = self._down.pop(topic)
            if gone.reason is not None:
                log.info("topic.available", topic=topic, down_s=round(now - gone.since, 1))
        due = []
        for topic in sorted(down):
            state = self._down.setdefault(topic, _Down(since=now))
            if now - state.since >= GRACE and now >= state.next_check:
                due.append((topic, state))
        if not due:
            return
        broker = await self.broker()
        asked: dict[
            tuple[str, Action], TransportError | None
        ] = {}  # permissions are the namespace's: one question each
        changed: dict[str, list[str]] = {}
        for topic, state in due:
            state.next_check = now + RECHECK
            action: Action = "consume" if "consume" in down[topic] else "produce"
            key = (_namespace(topic), action)
            if broker is None and key not in asked:
                asked[key] = await self.ask(topic, action)
            error = broker or asked[key]
            reason = (
                str(error)
                if error is not None
                else (
                    f"reconnecting to {topic}: the broker at {self.url} lets us {action} there again, and pulsar-client"
                    " retries with back-off"
                )
            )
            state.error = error
            if reason != state.reason:
                state.reason = reason
                changed.setdefault(reason, []).append(topic)
        for reason, topics in changed.items():
            log.warning("topic.unavailable", reason=reason, topics=topics)

"""Pulsar's exceptions, caught by name in one place (`broker_errors`) and translated into the product's `TransportError`
family."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Literal

import pulsar.asyncio as pulsar_asyncio

from ...errors import (
    AuthenticationFailed,
    BrokerUnreachable,
    MessageTooLarge,
    TransportClosed,
    TransportError,
)
from ...logs import get_logger
from ...schemas import queue_namespace
from .diagnosis import namespace_missing, not_authorized
from .native import NativePulsarException

log = get_logger("toolservice_base.transport")

_PULSAR_ERRORS: tuple[type[BaseException], ...] = (pulsar_asyncio.PulsarException, NativePulsarException)
_NOT_RETRIABLE_AUTH = {"AuthenticationError", "ErrorGettingAuthenticationData"}
HELD = {"ProducerBusy", "ProducerFenced"}
"""What creating an exclusive producer on a held topic says: ProducerFenced too (measured on 4.0.8, for a second
`Exclusive` producer, and for the `WaitForExclusive` ones queued when another fences the topic)."""
_UNREACHABLE = {
    "ConnectError",
    "Timeout",
    "NotConnected",
    "ServiceUnitNotReady",
    "LookupError",
    "TooManyLookupRequestException",
}
_CLOSED = {"AlreadyClosed", "ConsumerNotInitialized", "ProducerNotInitialized"}


def result_name(exc: BaseException) -> str:
    """The Pulsar result code's name, whichever of the two exception families raised it."""
    if isinstance(exc, pulsar_asyncio.PulsarException):
        return str(exc.error().name)
    return type(exc).__name__


def translate(
    exc: BaseException, doing: str, url: str, topic: str | None = None, *, role: str | None = None
) -> TransportError:
    """One Pulsar exception as the product's error, with a line that says what to do.

    `topic`: the one `doing` is on; `role`: the one our token names. A
    `Timeout` says only that no answer came: where the transport can ask the
    broker why (`PulsarTransport.diagnose`), it does, and says that instead.
    """
    name = result_name(exc)
    namespace = _namespace_of(topic) if topic is not None else None
    if name == "AuthorizationError" and namespace:
        return not_authorized(url, namespace, role, doing=doing)
    if name == "AuthorizationError":
        return AuthenticationFailed(
            f"the broker at {url} does not authorize our role{f' {role}' if role else ''} for {doing}"
            " (AuthorizationError): grant it what its kind of process needs on the topicspace's namespaces"
            " (deploy/pulsar-init.sh grants each kind its own role, TOOLREG_<KIND>_ROLE)"
        )
    if name in _NOT_RETRIABLE_AUTH:
        return AuthenticationFailed(
            f"the broker at {url} refused our credentials while {doing} ({name}); set PULSAR_AUTH_TOKEN to a valid"
            " token"
        )
    if name == "MessageTooBig":
        return MessageTooLarge(f"the broker at {url} refused a message as too large while {doing}; send less at once")
    if name in _CLOSED:
        return TransportClosed(f"{doing}: already closed")
    if name in _UNREACHABLE:
        return BrokerUnreachable(f"cannot reach the broker at {url} while {doing} ({name}); is it running?")
    if name == "TopicNotFound" and namespace:
        return namespace_missing(url, namespace, doing=doing)
    return TransportError(f"the broker at {url} failed while {doing}: {name}")


Refine = Callable[[str], TransportError | None]
"""A call site's own reading of a Pulsar result name (None: the general translation applies)."""


class broker_errors:  # noqa: N801 - used like a function: `with broker_errors(...)`
    """The one place a Pulsar exception is caught and turned into the product's error.

    As httpx maps its transport's exceptions in one context manager, every call
    into pulsar-client here runs inside one of these, in one of three ways:

    - raising (the default): the exception leaves as the translated
      `TransportError` (`refine` first, for a site's own result names), with no
      Pulsar traceback attached (`from None`). As `async with`, `explain` may
      replace the translation (it can ask whether a timed-out broker is up);
    - `log="event"`: logged at `level` with the error and dropped (closing,
      acknowledging: there is nothing to tell a caller);
    - `keep=True`: dropped silently; `error` holds it for the caller to decide
      (the receive loop, the retry loops).

    Anything that is not a Pulsar exception passes through untouched.
    """

    def __init__(
        self,
        doing: str = "",
        url: str = "",
        topic: str | None = None,
        *,
        refine: Refine | None = None,
        explain: Callable[[BaseException], Awaitable[TransportError]] | None = None,
        log: str | None = None,
        level: Literal["debug", "warning"] = "debug",
        keep: bool = False,
        **fields: Any,
    ) -> None:
        self._doing, self._url, self._topic = doing, url, topic
        self._refine, self._explain = refine, explain
        self._log, self._level, self._keep, self._fields = log, level, keep, fields
        self.error: BaseException | None = None

    def __enter__(self) -> "broker_errors":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc is None or not isinstance(exc, _PULSAR_ERRORS):
            return False
        self.error = exc
        if self._keep:
            return True
        if self._log is not None:
            getattr(log, self._level)(self._log, **self._fields, error=str(exc))
            return True
        raise self._translated(exc) from None

    async def __aenter__(self) -> "broker_errors":
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if (
            exc is not None
            and isinstance(exc, _PULSAR_ERRORS)
            and self._explain is not None
            and not (self._keep or self._log)
        ):
            self.error = exc
            refined = self._refine(result_name(exc)) if self._refine else None
            raise (refined or await self._explain(exc)) from None
        return self.__exit__(kind, exc, tb)

    def _translated(self, exc: BaseException) -> TransportError:
        refined = self._refine(result_name(exc)) if self._refine else None
        return refined or translate(exc, self._doing, self._url, self._topic)


def _namespace_of(topic: str) -> str | None:
    """`tenant/namespace` of `topic`: Apache Pulsar says TopicNotFound when that is missing."""
    try:
        return queue_namespace(topic)
    except ValueError:  # a name our queues never have (a workspace's `config:<workspace>`, say): still tenant/ns
        parts = topic.split("://", 1)[-1].split("/")
        return "/".join(parts[:2]) if len(parts) == 3 and all(parts) else None


Explain = Callable[[BaseException, str, str], Awaitable[TransportError]]
"""The transport's reading of a failed call (exception, what it was doing, topic), asking the broker why if it timed
out."""

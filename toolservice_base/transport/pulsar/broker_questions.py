"""`BrokerQuestions`: what a `PulsarTransport` asks the broker when an operation fails, times out or waits.

pulsar-client says "Timeout" for most refusals (`diagnosis` says why); the
transport turns each failure into its one line by asking the broker itself:
is it there, does it take our token (a handshake of our own), may our role
look the topic up, produce or consume there. And from the moment it opens,
it asks the broker's verdict on its token once, so that a producer, reader
or subscription being created for a refused token fails with that refusal
in milliseconds instead of pulsar-client's operation timeout. The questions
and their answers live here; `transport.py` only opens and closes things.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pulsar
import pulsar.asyncio as pulsar_asyncio

from ...errors import AuthenticationFailed, BrokerUnreachable, NotAuthorized, TransportError
from ...tasks import close_when_granted, retrieve_outcome
from ..base import broker_unreachable
from .diagnosis import Action, Claims, handshake, subscription_reserved, token_refused
from .errors import broker_errors, result_name, translate

T = TypeVar("T")

LOOKUP_TIMEOUT = 2.0
"""Seconds a diagnostic lookup of a topic may take; a broker that lets us in answers one in milliseconds."""


class BrokerQuestions:
    """The questions one transport asks its broker, on its own client (a lookup and a try need our role)."""

    def __init__(
        self, client: pulsar_asyncio.Client, url: str, token: str | None, abandoned: set[asyncio.Future[Any]]
    ) -> None:
        self._client = client
        self.url = url
        self._token = token
        self._claims = Claims.of(token)
        self._abandoned = abandoned
        """The transport's: what a question opened for nobody is closed when granted, and waited for at its close."""
        # The broker's verdict on our token, asked at once: a refused (or missing) token is then said within
        # milliseconds of the refusal, where pulsar-client retries it until its operation timeout (`unless_refused`).
        self._verdict = asyncio.ensure_future(handshake(url, token))

    @property
    def role(self) -> str | None:
        """The role the token claims (read, never verified), to name it in a message."""
        return self._claims.role

    def close(self) -> None:
        self._verdict.cancel()

    async def diagnose(
        self, topic: str, doing: str | None = None, action: Action | None = None
    ) -> TransportError | None:
        """Why `topic` cannot be used now, as the broker tells it; None if it lets us use it.

        Asks whether the broker is reachable, whether it accepts our token (a
        handshake of our own), whether it lets our role look the topic up and,
        given an `action`, whether it lets it produce or consume there: each
        answers in milliseconds, where pulsar-client would only say `Timeout`
        (see `diagnosis`).
        """
        return await self.broker_problem(doing) or await self.ask(topic, action, doing)

    async def broker_problem(self, doing: str | None = None) -> TransportError | None:
        down = await broker_unreachable(self.url)
        if down is not None:
            return BrokerUnreachable(down)
        answer = await handshake(self.url, self._token)
        if answer.accepted is False:
            return token_refused(self.url, self._token, answer.said, doing=doing)
        if (
            answer.accepted is None and self._claims.expired()
        ):  # no verdict (TLS, say), and the token's own exp has passed
            return token_refused(self.url, self._token, f"no verdict ({answer.said})", doing=doing)
        if answer.silent:
            return TransportError(
                f"the broker at {self.url} accepts connections but {answer.said}"
                f"{f' ({doing})' if doing else ''}: is it a Pulsar broker, and is it overloaded?"
            )
        return None

    async def ask(self, topic: str, action: Action | None, doing: str | None = None) -> TransportError | None:
        """Look `topic` up, then try `action` there once: a lookup needs only one of produce and consume (measured).

        A consume try is a reader at the latest message: it needs the same
        permission as a subscription and leaves no durable subscription behind,
        even on a persistent topic. What a try opens is closed at once; one
        the broker grants after we stopped waiting is closed when it comes.
        """
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            (f"looking up {topic}", lambda: self._client.get_topic_partitions(topic))
        ]
        if action == "produce":
            steps.append((f"producing on {topic}", lambda: self._client.create_producer(topic, batching_enabled=False)))
        elif action == "consume":
            steps.append(
                (
                    f"consuming from {topic}",
                    lambda: self._client.create_reader(topic, pulsar.MessageId.latest, receiver_queue_size=1),
                )
            )
        for trying, call in steps:
            attempt = asyncio.ensure_future(call())
            done, _ = await asyncio.wait({attempt}, timeout=LOOKUP_TIMEOUT)
            if not done:
                close_when_granted(attempt, lambda opened: self.undo(opened, topic), self._abandoned)
                return TransportError(
                    f"the broker at {self.url} accepts our token but gave no answer within {LOOKUP_TIMEOUT:g}s while"
                    f" {trying}{f' ({doing})' if doing else ''}; it may be overloaded or still starting"
                )
            with broker_errors(keep=True) as asking:
                await self.undo(attempt.result(), topic)
            if asking.error is not None:
                return translate(asking.error, doing or trying, self.url, topic, role=self._claims.role)
        return None

    async def unless_refused(self, attempt: asyncio.Future[T], doing: str) -> T:
        """What `attempt` opens, unless the broker refuses our token first: then that refusal, at once.

        Measured on Apache Pulsar 4.0.8: a missing or wrong token makes
        pulsar-client retry a creation until its operation timeout (10 s by
        default) and say "Timeout", while the broker refuses our own handshake
        in milliseconds. The caller closes what the attempt may still open
        (`close_when_granted`): this only stops waiting for it.
        """
        either: set[asyncio.Future[Any]] = {attempt, self._verdict}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        refused = None if attempt.done() else self.refused(doing)
        if refused is not None:
            # Nobody awaits the attempt now: its own failure, when the client gives up on it, is expected.
            attempt.add_done_callback(retrieve_outcome)
            raise refused
        return await attempt

    def refused(self, doing: str) -> AuthenticationFailed | None:
        """The broker's refusal of our token at the handshake `open` began, once it has answered; else None."""
        verdict = self._verdict
        if not verdict.done() or verdict.cancelled() or verdict.exception() is not None:
            return None
        answer = verdict.result()
        return token_refused(self.url, self._token, answer.said, doing=doing) if answer.accepted is False else None

    @staticmethod
    async def undo(opened: Any, topic: str) -> None:
        """Close the producer or reader a diagnosis opened; a lookup's answer needs nothing."""
        with broker_errors(log="diagnosis.undo_failed", topic=topic):
            if isinstance(opened, pulsar_asyncio.Producer | pulsar_asyncio.Reader):
                await opened.close()

    async def explain(
        self, exc: BaseException, doing: str, topic: str, action: Action | None = None, subscription: str = ""
    ) -> TransportError:
        """`translate`, and for a timeout, why: asked of the broker (`diagnose`). A shared `subscription` refused to a
        role that may consume there is reserved for other roles by the namespace (Pulsar's subscription permissions).

        Apache Pulsar drops a connection whose token is missing, wrong or
        expired, and closes the producers and consumers of a role whose
        permission is revoked or whose namespace is deleted; pulsar-client
        retries until its operation (or send) timeout, then says only
        "Timeout". The broker's own answer names the cause; only if it lets
        us in and looks the topic up is the timeout the broker's slowness.
        """
        if result_name(exc) != "Timeout":
            error = translate(exc, doing, self.url, topic, role=self._claims.role)
            if subscription and isinstance(error, NotAuthorized) and await self.ask(topic, "consume") is None:
                return subscription_reserved(self.url, error.namespace, subscription, self._claims.role)
            return error
        found = await self.diagnose(topic, doing, action)
        if found is not None:
            return found
        return TransportError(
            f"the broker at {self.url} accepts our token and lets us use {topic}, but did not complete {doing} in time "
            "(Timeout); it may be overloaded: try again"
        )

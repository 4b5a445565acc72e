"""Whether the registry can use the topics it cannot work without, in the broker's words: for `/readyz` and the log.

A topic the broker will not let it use (a revoked permission, an expired
token, a deleted namespace: what the transport found, see
`Transport.problem`) makes the registry not ready even while its other
connections are fine: a registry deaf to announcements lets every lease run
out. It does not stop for it: pulsar-client keeps reconnecting, and a grant,
a fresh token or a recreated namespace heals it. Meanwhile the reason is in
`readiness` and in the log, once when it starts (`registry.intake_failed`,
`registry.queries_failed`) and once when it heals (`..._restored`), not at
every look.
"""

from __future__ import annotations

from toolservice_base.logs import get_logger
from toolservice_base.transport import Transport

log = get_logger("discovery.registry")

TOPIC_CHECK = 1.0
"""Seconds between two looks at what the transport says of the registry's topics (`TopicWatch.report`)."""


class TopicWatch:
    """What the transport says of the topics of the registry's intake and query server, and what was last logged."""

    def __init__(self, connection: Transport) -> None:
        self._connection = connection
        self._reported: dict[str, str] = {}
        """Topic -> the problem last logged for it."""

    def topics(self) -> list[tuple[str, str, str]]:
        """(part, what it does there, topic) for each topic the intake and the query server cannot work without."""
        topics = self._connection.topics
        return [
            ("intake", "hear announcements", topics.tool_descriptors),
            ("intake", "send probes", topics.tool_probe),
            ("queries", "take queries", topics.registry_request),
            ("queries", "answer queries", topics.registry_response),
        ]

    def problem(self) -> str | None:
        """The first topic the registry cannot use, and why, in one line; None while it can use them all."""
        for _, doing, topic in self.topics():
            if (problem := self._connection.problem(topic)) is not None:
                return f"cannot {doing} on {topic}: {problem}"
        return None

    async def report(self) -> None:
        """Log a topic that the intake or the query server cannot use, and why, and when it can again (a periodic job,
        every `TOPIC_CHECK`)."""
        for part, doing, topic in self.topics():
            problem = self._connection.problem(topic)
            if problem == self._reported.get(topic):
                continue
            if problem is None:
                del self._reported[topic]
                log.info(f"registry.{part}_restored", topic=topic)
            else:
                self._reported[topic] = problem
                log.warning(f"registry.{part}_failed", topic=topic, cannot=doing, reason=problem)

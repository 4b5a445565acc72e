"""Whether the log a replica reads is whole: on a namespace without retention the broker deletes its history.

Apache Pulsar keeps a persistent topic's messages while a durable
subscription still needs them, and beyond that only for the namespace's
retention (none by default; deploy/pulsar-init.sh makes it unlimited on
`<topicspace>/state`). The log is read by readers, which hold nothing, so
without retention the broker drops every ledger it closes (at a topic's
reload, or a rollover) and, once no client uses a topic, the topic itself.
A reader placed in deleted history starts at whatever is left without a
word, and a replica would build, then serve, a state missing those writes.
These rules, fed what a reader meets, tell:

- every entry names the version its writer's state was at (`previous`): an
  entry to apply on a state below that means the entries between are gone;
- after a snapshot the reader starts at the snapshot's own entry
  (inclusive). Met first, nothing up to it was deleted. Met otherwise, or
  not at all, the broker deleted history: the next entry applied says
  whether writes went with it (a gap, or an entry of an older writer that
  names nothing: lost) or not (the snapshot still holds them: said, since
  the next deletion loses some); with nothing after it, writes after the
  snapshot may be gone: lost;
- a version any replica has applied was in the log first, so a log that
  ends below it lost entries, even with no later entry to show a gap (all
  of it deleted, which a lone reader cannot tell from a new log).

No I/O here: `ReplicatedLog` feeds it and acts on what it finds.
"""

from __future__ import annotations

from dataclasses import dataclass


def namespace_of(topic: str) -> str:
    """`tenant/namespace` of a topic (`persistent://t/state/config-log`: `t/state`), where its retention is set."""
    return "/".join(topic.split("://", 1)[-1].split("/")[:2])


def retention_fix(namespace: str) -> str:
    """What an operator runs so the broker keeps `namespace`'s history for good."""
    return (
        f"set unlimited retention (deploy/pulsar-init.sh does: pulsar-admin namespaces set-retention {namespace} --size"
        " -1 --time -1)"
    )


@dataclass(frozen=True)
class Finding:
    """What is wrong with the log, in the one line an operator reads."""

    lost: bool
    """Writes are (or may be) gone: no state built from this log may be served. False: history was deleted, but the
    snapshot restored still holds it, so the state is whole (for now)."""
    line: str
    namespace: str


class Wholeness:
    """Follows one reader of `topic`, from its start (after the snapshot at `snapshot_version`, or the log's start)."""

    def __init__(self, topic: str, snapshot_version: int | None = None) -> None:
        """`snapshot_version`: the snapshot restored, when the reader starts at its entry (inclusive); None
        otherwise."""
        self.topic = topic
        self.namespace = namespace_of(topic)
        self._awaiting = snapshot_version
        self._gone: int | None = None

    def met(self, version: int) -> None:
        """Every entry the reader meets, in order, before it is applied or ignored."""
        if self._awaiting is not None:
            expected, self._awaiting = self._awaiting, None
            if version != expected:
                self._gone = expected

    def applying(self, state: int, version: int, previous: int | None) -> Finding | None:
        """An entry above the state (at `state`) is about to be applied."""
        gone, self._gone = self._gone, None
        if previous is not None and previous > state:
            return self._lost(
                f"the log {self.topic} lacks its entries after version {state} (up to version {previous})"
            )
        if gone is None:
            return None
        if previous is None:
            return self._lost(
                f"the log {self.topic} no longer holds the entry at version {gone} that its last snapshot names, and"
                f" its next entry (version {version}, by an older writer) does not say which it follows, so writes in"
                " between may be gone"
            )
        return Finding(
            False,
            f"the broker deleted the log {self.topic} up to version {gone} at least, as it does when the namespace"
            f" {self.namespace} keeps no history (no retention); the last snapshot still holds those writes, but the"
            f" next deletion can lose some: {retention_fix(self.namespace)}",
            self.namespace,
        )

    def at_end(self) -> Finding | None:
        """The reader's start read everything there was: a snapshot's entry gone with nothing after it is a loss."""
        gone = self._awaiting if self._awaiting is not None else self._gone
        self._awaiting = self._gone = None
        if gone is None:
            return None
        return self._lost(
            f"the log {self.topic} no longer holds the entry at version {gone} that its last snapshot names, nor any"
            f" entry after it, so writes after version {gone} may be gone"
        )

    def behind(self, state: int, version: int, seen_by: str) -> Finding | None:
        """Read to its end, the log reached `state`; replica `seen_by` has applied `version` from it."""
        if state >= version:
            return None
        return self._lost(
            f"replica {seen_by} has applied version {version}, but the log {self.topic} ends at version {state}"
        )

    def _lost(self, what: str) -> Finding:
        return Finding(
            True,
            f"{what}: the broker deleted entries, as it does when the namespace {self.namespace} keeps no history (no "
            f"retention); {retention_fix(self.namespace)}, then restore the store from an export "
            "(TOOLREG_STORE=pulsar toolreg store import --force FILE)",
            self.namespace,
        )

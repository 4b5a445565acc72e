"""Whose key a record is under, and whether this replica's key is the group's: the group key's rules.

Every record read from a state topic (a status, a lock marker, a log entry, a
snapshot's manifest or chunk) is authenticated once (`authenticate`), and the
verdict is both what the reader does with it (apply only `verified` or
`unchecked` ones) and evidence for `KeyWitness`, which decides one thing: is
this replica's key (or absence of one) the group's?

The failure it prevents: a replica started with another key, or none, beside
a keyed group refused every record the group wrote, so it heard no active,
fenced the lock after its patience, wrote a marker of term 1, made the
group's active step down (a marker the group could not read was a silent
holder), and the terms climbed until it became active with an empty store.
A replica whose key does not match never competes: it stops, in one line
naming both keys.

Whose key is the group's is decided by who wrote the persistent records (the
log, its snapshots, the lock's markers; never statuses, which are hints and
include a replica's own): a replica that has read any record signed as it
signs (under its key, or unsigned when it has none) shares its key with a
writer of the group, and never stops for records it cannot read afterwards
(forgeries: refused one by one). One that has read records and matched none
is the odd one out.
Someone allowed to produce on the state topics can make a replica starting
on a topicspace with no record of the group yet stop this way; the broker's
permissions (only the store's role produces there) are the wall against
that, as against every other record such a role can write.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from ..groupkey import MAC_PROPERTY, GroupKey, signer_of

Verdict = Literal["verified", "unchecked", "unsigned", "foreign", "signed-unkeyed", "forged"]
"""- `verified`: its MAC checks under a key this replica holds;
- `unchecked`: no key here and none on the record (the broker's permissions alone);
- `unsigned`: this replica has a key, the record has no MAC;
- `foreign`: signed with a key id this replica does not hold;
- `signed-unkeyed`: signed, and this replica has no key to check it with;
- `forged`: a key id it holds, a MAC that does not match (or a malformed one)."""

ACCEPTED: frozenset[Verdict] = frozenset({"verified", "unchecked", "signed-unkeyed"})
"""What a reader takes. A reader with no key takes what it cannot check, as it always did (`toolreg replicas` without
the key lists every status); a replica that finds the group signing stops instead (`KeyWitness.mismatch`)."""


@dataclass(frozen=True)
class Seen:
    """One record's authentication: the verdict, the key id it names (if any) and, when refused, why in a few words."""

    verdict: Verdict
    key_id: str | None = None
    reason: str = ""

    @property
    def accepted(self) -> bool:
        return self.verdict in ACCEPTED


def authenticate(
    key: GroupKey | None, properties: dict[str, str], kind: str, topic: str, data: bytes, *context: str
) -> Seen:
    """The verdict on a record of `kind` read from `topic` (its properties carry the MAC, if any)."""
    tag = properties.get(MAC_PROPERTY)
    signer = signer_of(tag)
    if key is None:
        if tag:
            return Seen("signed-unkeyed", signer, f"signed with group key {signer}, and this replica has none")
        return Seen("unchecked")
    reason = key.check(tag, kind, topic, data, *context)
    if reason is None:
        return Seen("verified", signer)
    if not tag:
        return Seen("unsigned", None, reason)
    if signer not in key.secrets:
        return Seen("foreign", signer, reason)
    return Seen("forged", signer, reason)


@dataclass
class KeyWitness:
    """What the records read so far say of this replica's key against the group's (`mismatch`)."""

    key: GroupKey | None
    verified: int = 0
    """Records that match how this replica signs: authenticated under our key, or (with no key) unsigned. Once any
    does, our key (or absence of one) is the group's."""
    foreign: Counter[str] = field(default_factory=Counter)
    """Records signed with a key id we do not hold, by key id."""
    signed: Counter[str] = field(default_factory=Counter)
    """Records signed while we hold no key, by key id."""
    unsigned: int = 0
    """Records without a MAC while we hold a key."""
    where: dict[str, str] = field(default_factory=dict)
    """A topic each kind of evidence came from (for the line an operator reads)."""

    def saw(self, seen: Seen, topic: str) -> None:
        if seen.verdict in ("verified", "unchecked"):
            self.verified += 1
        elif seen.verdict == "foreign" and seen.key_id:
            self.foreign[seen.key_id] += 1
            self.where.setdefault("foreign", topic)
        elif seen.verdict == "signed-unkeyed" and seen.key_id:
            self.signed[seen.key_id] += 1
            self.where.setdefault("signed", topic)
        elif seen.verdict == "unsigned":
            self.unsigned += 1
            self.where.setdefault("unsigned", topic)

    def mismatch(self) -> str | None:
        """Why this replica's key is not the group's, in the one line it stops with; None while it may be.

        Never once a record checked under our key: from then on what we cannot
        read is a forgery, refused record by record, and no reason to stop.
        """
        if self.verified:
            return None
        fix = "give every replica of the group the same key file (TOOLREG_GROUP_KEY; `toolreg group-key` makes one)"
        if self.key is None and self.signed:
            theirs = ", ".join(sorted(self.signed))
            return (
                f"group key mismatch: the group signs its records on {self.where['signed']} with group key {theirs},"
                f" and this replica has no group key; it takes no part in the group: {fix}"
            )
        if self.key is not None and self.foreign:
            theirs = ", ".join(sorted(self.foreign))
            return (
                f"group key mismatch: records on {self.where['foreign']} are signed with group key {theirs}, and this"
                f" replica holds {', '.join(self.key.ids)} ({self.key.describe()}); it takes no part in the group:"
                f" {fix}"
            )
        if self.key is not None and self.unsigned:
            return (
                f"group key mismatch: the group's records on {self.where['unsigned']} are unsigned (it runs without a"
                f" group key), and this replica has {self.key.describe()}; it takes no part in the group: start every"
                " replica alike (a group keeps the key it started with: to add one, move the store to a fresh"
                " topicspace with `toolreg store export` and `toolreg store import`)"
            )
        return None

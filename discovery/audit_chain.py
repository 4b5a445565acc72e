"""Signed, chained audit records: how a front seals each record, and the rules that tell them from forgeries.

Anyone who may produce on the audit namespace (every agent's role) can
publish a record that looks exactly like a front's, so a record is believed
only when it proves where it came from and where it stands:

- signed: the front's Ed25519 key (`TOOLREG_MCP_AUDIT_KEY`) signs the
  canonical JSON of the record without its `signature`, prefixed with
  `AUDIT_DOMAIN` (so no other signed bytes of toolreg check as a record).
  The signature is `<key-id>:<base64>`, as an announcement's; verifiers know
  the fronts' public keys from the trust policy (`"audit-fronts"`).
- chained: each front process is one chain (`front`, a fresh id per process,
  and `started`). Its records carry `sequence` 1, 2, 3... and the hash of
  the record before (`previous`), so a record that never arrived leaves a
  gap, one replayed comes again at a place already taken, and one that comes
  late fills a gap out of order. A restarted front starts a new chain at 1.

`AuditChain` is the front's side; `AuditVerifier` reads records in the
topic's order and judges each. It keeps a chain's last place (bounded
chains); with `remember` on (`toolreg audit verify`) it also keeps each
record's hash and the gaps, to tell a replay from a late record.
A chain whose first record read is not its first lost its beginning: to the
topic's retention when it began before the oldest good record read (its
`started` is earlier; the fronts' clocks are taken to agree), else missing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import ValidationError

from toolservice_base.schemas import MAX_AUDIT_BYTES, AuditRecord, canonical_json
from toolservice_base.signing import key_id

AUDIT_DOMAIN = b"toolreg-audit-record-1\n"
"""Prefixed to what a record's signature covers: bytes signed for anything else never check as a record."""
MAX_CHAINS = 10_000
"""Chains a verifier follows at once (the least recently heard go first): only trusted keys make chains."""

Verdict = Literal["good", "unsigned", "forged", "replayed", "reordered", "broken"]
VERDICTS: tuple[Verdict, ...] = ("good", "unsigned", "forged", "replayed", "reordered", "broken")
"""`good`: signed by a trusted front and in its place. `unsigned`: no signature (a front without a key, or anyone).
`forged`: not a record, or a signature that is not a trusted front's or does not match. `replayed`: a copy of a
record already read. `reordered`: a genuine record read after later ones of its chain. `broken`: signed, but not
following its chain (a second record at a place already taken, or a wrong `previous`)."""


def record_hash(wire: Mapping[str, Any]) -> str:
    """The sha256 (hex) of a record's canonical JSON, signature included: what the next record's `previous` holds."""
    return hashlib.sha256(canonical_json(dict(wire)).encode()).hexdigest()


def signed_part(wire: Mapping[str, Any]) -> bytes:
    """What a record's signature covers: the domain, then its canonical JSON without `signature`."""
    return AUDIT_DOMAIN + canonical_json({k: v for k, v in wire.items() if k != "signature"}).encode()


class AuditChain:
    """One front process's chain: seals the records it publishes, in the order it publishes them."""

    def __init__(self, front: str, key: Ed25519PrivateKey | None, *, started: float | None = None) -> None:
        self.front = front
        self.key = key
        self.started = time.time() if started is None else started
        self.sequence = 0
        self.last: str | None = None

    def seal(self, record: AuditRecord, dropped: int = 0) -> AuditRecord:
        """`record` as the chain's next: its place, the previous record's hash, and (with a key) signed."""
        self.sequence += 1
        update = {
            "front": self.front,
            "sequence": self.sequence,
            "previous": self.last,
            "started": self.started,
            "dropped": dropped,
            "signature": None,
        }
        sealed = record.model_copy(update=update)
        wire = sealed.to_wire()
        if self.key is not None:
            raw = self.key.sign(signed_part(wire))
            wire["signature"] = f"{key_id(self.key.public_key())}:{base64.b64encode(raw).decode()}"
            sealed = sealed.model_copy(update={"signature": wire["signature"]})
        self.last = record_hash(wire)
        return sealed


@dataclass(frozen=True)
class Checked:
    """The verdict on one record read; `record` None when it did not parse."""

    verdict: Verdict
    record: AuditRecord | None
    reason: str = ""


@dataclass
class _Chain:
    key: str
    front: str
    started: float | None
    last: int
    last_hash: str
    seen: set[bytes] = field(default_factory=set)
    gaps: list[list[int]] = field(default_factory=list)
    """Places not read yet, as [first, last] ranges (`remember` only)."""
    from_start_lost: bool = False
    """Its first record read was not its first."""


@dataclass(frozen=True)
class Gap:
    """Records of one chain that were never read: places `first` to `last`."""

    key: str
    front: str
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


class AuditVerifier:
    """Judges records in the order the topic holds them, against the trusted fronts' keys (by key id)."""

    def __init__(
        self, keys: Mapping[str, Ed25519PublicKey], *, remember: bool = True, max_chains: int = MAX_CHAINS
    ) -> None:
        self.keys = dict(keys)
        self.remember = remember
        self.max_chains = max_chains
        self.chains: OrderedDict[tuple[str, str], _Chain] = OrderedDict()
        self.counts: dict[Verdict, int] = dict.fromkeys(VERDICTS, 0)
        self.dropped = 0
        """Records the fronts said they dropped (in good records)."""
        self.trail_start: float | None = None
        """`at` of the first good record read: where what the topic keeps begins."""

    def check_bytes(self, data: bytes) -> Checked:
        """The verdict on one message of the audit topic."""
        if len(data) > MAX_AUDIT_BYTES:
            return self._count(Checked("forged", None, f"{len(data)} bytes: larger than any audit record"))
        try:
            wire = json.loads(data)
            record = AuditRecord.model_validate(wire)
        except (ValueError, ValidationError):
            return self._count(Checked("forged", None, "not an audit record"))
        return self._count(self._judge(record, wire))

    def _count(self, checked: Checked) -> Checked:
        self.counts[checked.verdict] += 1
        return checked

    def _judge(self, record: AuditRecord, wire: dict[str, Any]) -> Checked:
        if record.signature is None:
            return Checked("unsigned", record, "no signature (its front has no audit key)")
        kid, _, encoded = record.signature.partition(":")
        public = self.keys.get(kid)
        if public is None:
            return Checked("forged", record, f"signed by key {kid[:16]!r}, which is no trusted front's")
        try:
            public.verify(base64.b64decode(encoded, validate=True), signed_part(wire))
        except (InvalidSignature, binascii.Error, ValueError):
            return Checked("forged", record, f"its signature does not match it (key {kid}): the record was changed")
        if record.sequence is None:
            return Checked("broken", record, "signed but not chained (no sequence)")
        return self._place(record, kid, record_hash(wire))

    def _place(self, record: AuditRecord, kid: str, digest: str) -> Checked:
        assert record.sequence is not None
        chain = self.chains.get((kid, record.front))
        if chain is None:
            return self._begin(record, kid, digest)
        self.chains.move_to_end((kid, record.front))
        sequence = record.sequence
        if sequence <= chain.last:
            return self._behind(chain, record, digest)
        if sequence == chain.last + 1 and record.previous != chain.last_hash:
            return Checked("broken", record, f"record {sequence} does not follow record {chain.last} of its chain")
        if sequence > chain.last + 1 and self.remember:
            chain.gaps.append([chain.last + 1, sequence - 1])
        chain.last, chain.last_hash = sequence, digest
        return self._good(chain, record, digest)

    def _begin(self, record: AuditRecord, kid: str, digest: str) -> Checked:
        assert record.sequence is not None
        if record.sequence == 1 and record.previous is not None:
            return Checked("broken", record, "the first record of a chain names a record before it")
        chain = _Chain(kid, record.front, record.started, record.sequence, digest)
        if record.sequence > 1:
            chain.from_start_lost = True
            if self.remember:
                chain.gaps.append([1, record.sequence - 1])
        self.chains[(kid, record.front)] = chain
        while len(self.chains) > self.max_chains:
            self.chains.popitem(last=False)
        return self._good(chain, record, digest)

    def _good(self, chain: _Chain, record: AuditRecord, digest: str) -> Checked:
        if self.trail_start is None:
            self.trail_start = record.at
        if self.remember:
            chain.seen.add(bytes.fromhex(digest)[:16])
        self.dropped += record.dropped
        return Checked("good", record)

    def _behind(self, chain: _Chain, record: AuditRecord, digest: str) -> Checked:
        """A record at or before its chain's last place: a copy, a late one, or a second history."""
        sequence = record.sequence
        assert sequence is not None
        if not self.remember:
            return Checked("replayed", record, f"record {sequence} comes after record {chain.last} of its chain")
        if bytes.fromhex(digest)[:16] in chain.seen:
            return Checked("replayed", record, f"record {sequence} of its chain was read before")
        for gap in chain.gaps:
            if gap[0] <= sequence <= gap[1]:
                chain.gaps.remove(gap)
                parts = ([gap[0], sequence - 1], [sequence + 1, gap[1]])
                chain.gaps.extend(part for part in parts if part[0] <= part[1])
                chain.seen.add(bytes.fromhex(digest)[:16])
                return Checked("reordered", record, f"record {sequence} comes after record {chain.last} of its chain")
        return Checked("broken", record, f"a second record {sequence} of its chain, unlike the first")

    def gaps(self) -> tuple[list[Gap], list[Gap]]:
        """(missing, trimmed): places never read, and a chain's beginning the topic no longer keeps (it began before
        the oldest good record read)."""
        missing: list[Gap] = []
        trimmed: list[Gap] = []
        for chain in self.chains.values():
            for first, last in sorted(chain.gaps):
                gap = Gap(chain.key, chain.front, first, last)
                aged = first == 1 and chain.from_start_lost and self._began_before_trail(chain)
                (trimmed if aged else missing).append(gap)
        return missing, trimmed

    def _began_before_trail(self, chain: _Chain) -> bool:
        return chain.started is not None and self.trail_start is not None and chain.started < self.trail_start

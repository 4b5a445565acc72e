"""The group key: a secret only the replicas hold, under which every record they write on a state topic is signed.

Anyone the broker lets produce on `<topicspace>/state` could otherwise write
a log entry, a snapshot or a lock marker that every replica would apply. With
a group key each record carries a MAC (HMAC-SHA256, in its `mac` property)
over what it is (`entry`, `chunk`, `manifest`, `marker`, `status`), the
topic it was written to and its bytes; a replica applies only records whose
MAC it can check, and refuses (and logs) the rest. The broker's permissions
stay the first wall; the key is the second, and the only one against a role
that may produce there.

The key file is JSON, mode 0600, made by `toolreg group-key new PATH`:

    {"format": 1, "signing": "<id>", "keys": [{"id": "<id>", "secret": "<base64 of 32 bytes>"}]}

Every key listed is accepted; records are signed with `signing`. That is what
a rotation needs (`toolreg group-key rotate PATH`, run three times, each
followed by a restart of every replica, one at a time): add the new key
(accepted, not yet signing with it), sign with the new key, drop the old one.
At every step each replica accepts what every other signs with.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.schemas import ConfigRequest
from toolservice_base.signing import (
    SigningError,
    config_signature_terms,
    config_signature_text,
    config_signed_bytes,
    read_config_signature,
)

FORMAT = 1
SECRET_BYTES = 32
MAX_KEYS = 2
"""Keys a file may hold: the one signing and, during a rotation, one more."""
DOMAIN = b"toolreg-state-1"
"""Bound into every MAC, so a tag made for anything else never checks here."""
MAC_PROPERTY = "mac"
"""The message property a signed record carries its MAC in: `<key id>:<base64 of the HMAC>`."""
CONFIG_SCHEME = "group-2"
"""The scheme of the registry's signature on its config writes (an operator's is `ed25519-2`)."""
CONFIG_KIND = "config-write"


class GroupKeyError(ToolDiscoveryError, ValueError):
    """The group key file is missing, unreadable or malformed; the message says which and what to do."""


def key_id(secret: bytes) -> str:
    """16 hex digits of the secret's sha256: names the key in every MAC without saying anything of it."""
    return hashlib.sha256(secret).hexdigest()[:16]


def signer_of(tag: str | None) -> str | None:
    """The key id a MAC (`<key id>:<base64>`) names, unchecked; None for no MAC."""
    if not tag:
        return None
    return tag.partition(":")[0][:16] or None


def _part(value: bytes | str) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return len(raw).to_bytes(4, "big") + raw


@functools.lru_cache(maxsize=64)
def _head(kind: str, topic: str) -> bytes:
    """What every MAC of a `kind` record on `topic` begins with (a handful of pairs, each built once)."""
    return _part(DOMAIN) + _part(kind) + _part(topic)


@dataclass(frozen=True)
class GroupKey:
    """The keys a replica accepts, and the one it signs with."""

    secrets: dict[str, bytes]
    signing: str
    path: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.signing not in self.secrets:
            raise GroupKeyError(f"group key: the signing key {self.signing} is not among the keys")

    @classmethod
    def generate(cls, secret: bytes | None = None) -> "GroupKey":
        """A new key (`secret`: its bytes, when the caller draws them: a seeded simulation)."""
        secret = secret if secret is not None else secrets.token_bytes(SECRET_BYTES)
        return cls({key_id(secret): secret}, key_id(secret))

    @property
    def ids(self) -> list[str]:
        return list(self.secrets)

    def _digest(self, secret: bytes, kind: str, topic: str, data: bytes, context: tuple[str, ...]) -> bytes:
        message = b"".join([_head(kind, topic), *(_part(c) for c in context), _part(data)])
        return hmac.digest(secret, message, "sha256")  # one call into OpenSSL: every record read or written pays it

    def tag(self, kind: str, topic: str, data: bytes, *context: str) -> str:
        """The MAC of a record of `kind` written to `topic`: `<key id>:<base64>`."""
        digest = self._digest(self.secrets[self.signing], kind, topic, data, context)
        return f"{self.signing}:{base64.b64encode(digest).decode()}"

    def check(self, tag: str | None, kind: str, topic: str, data: bytes, *context: str) -> str | None:
        """None if `tag` is a MAC of this record under one of our keys; else why not, in a few words."""
        if not tag:
            return "unsigned (no group-key MAC)"
        kid, _, encoded = tag.partition(":")
        secret = self.secrets.get(kid)
        if secret is None:
            return f"signed with a key this replica does not hold ({kid[:16]!r})"
        try:
            given = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            return "a malformed MAC"
        if not hmac.compare_digest(given, self._digest(secret, kind, topic, data, context)):
            return f"a MAC that does not match its content (key {kid})"
        return None

    def sign_config(self, request: ConfigRequest, topicspace: str, now: float | None = None) -> ConfigRequest:
        """`request` signed for `topicspace` by the registry that holds this key
        (`group-2:<key id>:<expires>:<nonce>:<topicspace>:<base64>`), for a store whose trust policy covers the
        config queue: the registry's own writes pass."""
        expires, nonce = config_signature_terms(now)
        unsigned = request.model_copy(update={"signature": None})
        signed = config_signed_bytes(unsigned, topicspace, expires, nonce)
        digest = self._digest(self.secrets[self.signing], CONFIG_KIND, topicspace, signed, ())
        text = config_signature_text(CONFIG_SCHEME, self.signing, topicspace, expires, nonce, digest)
        return unsigned.model_copy(update={"signature": text})

    def check_config(self, request: ConfigRequest, topicspace: str) -> str | None:
        """None if a replica holding one of these keys signed `request` for `topicspace` (its expiry aside); else
        why not."""
        try:
            signature = read_config_signature(request.signature or "")
        except SigningError as exc:
            return str(exc)
        if signature.scheme != CONFIG_SCHEME:
            return "not signed by the registry"
        signed = config_signed_bytes(request, topicspace, signature.expires, signature.nonce)
        return self.check(f"{signature.key_id}:{signature.encoded}", CONFIG_KIND, topicspace, signed)

    def describe(self) -> str:
        where = f" from {self.path}" if self.path else ""
        others = [k for k in self.secrets if k != self.signing]
        also = f", also accepting {', '.join(others)} (a rotation)" if others else ""
        return f"group key {self.signing}{where}{also}"

    # --- the file -----------------------------------------------------------------------

    def to_json(self) -> str:
        keys = [{"id": kid, "secret": base64.b64encode(secret).decode()} for kid, secret in self.secrets.items()]
        return json.dumps({"format": FORMAT, "signing": self.signing, "keys": keys}, indent=2) + "\n"

    def save(self, path: str | Path, *, new: bool = False) -> Path:
        """Write the file (mode 0600; `new`: refuse to replace one), atomically."""
        target = Path(path)
        if new and target.exists():
            raise GroupKeyError(f"{target} exists; remove it or choose another path (rotate it with `rotate`)")
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_name(target.name + ".tmp")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self.to_json())
        os.replace(scratch, target)
        return target

    @classmethod
    def load(cls, path: str | Path) -> "GroupKey":
        source = Path(path)
        try:
            raw = json.loads(source.read_text())
        except FileNotFoundError:
            raise GroupKeyError(
                f"group key {source} not found; make one with `toolreg group-key new {source}`"
            ) from None
        except (OSError, ValueError) as exc:
            raise GroupKeyError(f"group key {source} is not readable JSON: {exc}") from None
        try:
            return cls._parse(raw, source)
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise GroupKeyError(
                f"group key {source} is malformed ({exc}); make a new one with `toolreg group-key new PATH`"
            ) from None

    @classmethod
    def _parse(cls, raw: object, source: Path) -> "GroupKey":
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(raw.get("keys"), list):
            raise ValueError(f'expected {{"format": {FORMAT}, "signing": ..., "keys": [...]}}')
        found: dict[str, bytes] = {}
        for entry in raw["keys"]:
            secret = base64.b64decode(str(entry["secret"]), validate=True)
            if len(secret) < SECRET_BYTES:
                raise ValueError(f"a key of {len(secret)} bytes; keys are {SECRET_BYTES} bytes")
            found[key_id(secret)] = secret
        if not 1 <= len(found) <= MAX_KEYS:
            raise ValueError(f"{len(found)} keys; a file holds 1, or {MAX_KEYS} during a rotation")
        signing = str(raw["signing"])
        if signing not in found:
            raise ValueError(f"the signing key {signing} is not among its keys")
        return cls(found, signing, source)

    def rotated(self, secret: bytes | None = None) -> tuple["GroupKey", str]:
        """The next step of a rotation, and what it did: add a new key (`secret`, or drawn now); sign with it; drop the
        old one."""
        if len(self.secrets) == 1:
            secret = secret if secret is not None else secrets.token_bytes(SECRET_BYTES)
            added = key_id(secret)
            return (
                GroupKey({**self.secrets, added: secret}, self.signing, self.path),
                f"step 1 of 3: added key {added} (accepted, not signing yet); restart every replica with this file,"
                " then run rotate again",
            )
        newer = next(kid for kid in self.secrets if kid != self.signing)
        if list(self.secrets).index(newer) > list(self.secrets).index(self.signing):
            return (
                GroupKey(self.secrets, newer, self.path),
                f"step 2 of 3: signing with {newer} now ({self.signing} still accepted); restart every replica with"
                " this file, then run rotate again",
            )
        return (
            GroupKey({self.signing: self.secrets[self.signing]}, self.signing, self.path),
            f"step 3 of 3: dropped key {newer}; restart every replica with this file: the rotation is done",
        )


def protection_line(key: GroupKey | None, namespace: str) -> str:
    """What guards the state topics, for the start-up line of a replica: never silent about having no key."""
    if key is None:
        return (
            f"{namespace}: protected by the broker's permissions alone (no group key: make one with `toolreg group-key"
            " new PATH` and give every replica TOOLREG_GROUP_KEY=PATH)"
        )
    return f"{namespace}: every record signed with {key.describe()}; unsigned or forged ones are refused"


def group_key_from(path: str | Path | None) -> GroupKey | None:
    """The key at `path`, or None (no group key: the state topics are protected by the broker's permissions alone)."""
    return GroupKey.load(path) if path else None

"""Ed25519 signatures on announcements, and on writes to the config store.

A signature covers the canonical JSON of the announcement without its
`signature` field, so any change to any field (a tool description, the
sequence, the time) breaks it. The field holds `<key-id>:<base64 signature>`;
the key id (16 hex digits of the public key's sha256) lets the registry pick
the key without trying each one, and never stands in for it: the policy
stores full public keys.

A config write (`ConfigRequest`, `toolreg config put --signing-key`) is signed
whole: its canonical JSON, the topicspace it is for, when it expires and a
nonce (its unique id). Its `signature` field holds
`ed25519-2:<key-id>:<expires>:<nonce>:<topicspace>:<base64 signature>`, every part in
exactly one form (`read_config_signature`). A store whose trust policy covers
the config queue takes writes of the items it guards only when an operator
key of the policy signed them for its topicspace, before they expired
(`check_expiry`), and takes each signed request once.

A tool service's answer is signed too, when the service has a key: its
`answer-signature` property (`<key-id>:<base64 signature>`) covers the
request's id and the answer's bytes as sent (`answer_signed_bytes`). The
registry copies the public key it accepted the service's announcement with
into the service's config item (`answer-key`), and a caller that finds one
there drops every answer the key did not sign.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, cast

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from pydantic import BaseModel

from .errors import ToolDiscoveryError
from .schemas import Announcement, canonical_json

CONFIG_SIGNATURE = "ed25519-2"
"""The scheme of an operator's signature on a config write (the registry's is its group key's, `group-2`)."""
OLDER_CONFIG_SCHEMES = ("ed25519", "group")
"""The schemes of an older toolreg's signatures, which covered neither the topicspace nor an expiry: refused."""
SIGNATURE_WINDOW = 60.0
"""Seconds a signed config write is good for, from when it was signed: a copy replayed later is refused."""


class SigningError(ToolDiscoveryError, ValueError):
    """A key or signature is unusable; the message says which and why."""


def key_id(public: Ed25519PublicKey) -> str:
    return hashlib.sha256(public_key_text(public).encode()).hexdigest()[:16]


def public_key_text(public: Ed25519PublicKey) -> str:
    """The public key as base64 of its 32 raw bytes: one line, easy to paste into a policy."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def parse_public_key(text: str) -> Ed25519PublicKey:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        raise SigningError(f"not an Ed25519 public key (base64 of 32 bytes): {text[:20]!r}...") from None


def generate_key_pair(private_path: Path) -> tuple[Path, Path]:
    """Write `<name>` (PEM private key, mode 0600) and `<name>.pub`; refuse to overwrite."""
    public_path = private_path.with_name(private_path.name + ".pub")
    for path in (private_path, public_path):
        if path.exists():
            raise SigningError(f"{path} exists; remove it or choose another name")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    public_path.write_text(public_key_text(key.public_key()) + "\n")
    return private_path, public_path


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SigningError(f"cannot read signing key {path}: {exc.strerror}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise SigningError(f"{path} is not an unencrypted PEM private key (make one with `toolreg keygen`)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{path} is not an Ed25519 key (make one with `toolreg keygen`)")
    return key


def signed_bytes(announcement: Announcement) -> bytes:
    body = announcement.to_wire()
    body.pop("signature", None)
    return canonical_json(body).encode()


def sign(announcement: Announcement, key: Ed25519PrivateKey) -> Announcement:
    signature = base64.b64encode(key.sign(signed_bytes(announcement))).decode()
    return announcement.model_copy(update={"signature": f"{key_id(key.public_key())}:{signature}"})


def signature_key_id(announcement: Announcement) -> str | None:
    if not announcement.signature or ":" not in announcement.signature:
        return None
    return announcement.signature.split(":", 1)[0]


def verify(announcement: Announcement, public: Ed25519PublicKey) -> bool:
    if not announcement.signature or ":" not in announcement.signature:
        return False
    kid, _, encoded = announcement.signature.partition(":")
    if kid != key_id(public):
        return False
    try:
        public.verify(base64.b64decode(encoded, validate=True), signed_bytes(announcement))
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


CONFIG_WRITE_DOMAIN = "toolreg-config-write-2"
"""Bound into what a config write's signature covers, so bytes signed for anything else never check as one."""
DECISION_DOMAIN = "toolreg-decision-2"
"""Bound into what an operator's decision on a held definition (`toolreg approve`, `reject`) is signed over."""
NONCE = re.compile(r"^[0-9a-f]{32}$")
EXPIRES = re.compile(r"^[0-9]{1,12}\.[0-9]{3}$")


@dataclass(frozen=True)
class ConfigSignature:
    """A config write's signature, read strictly: every part in the one form a signer writes it."""

    scheme: str
    key_id: str
    topicspace: str
    """The topicspace it was signed for (signed, too): a store of another one refuses it."""
    expires: str
    """When it stops being good (Unix seconds, 3 decimals), as signed."""
    nonce: str
    """The signed request's unique id: a store takes it once (`discovery.store.write_policy`)."""
    encoded: str
    raw: bytes
    """The signature's bytes, decoded from `encoded` (canonical base64: no other text decodes to them)."""


def config_signature_terms(now: float | None = None, lifetime: float = SIGNATURE_WINDOW) -> tuple[str, str]:
    """(expires, nonce) for a new signature: good for `lifetime` seconds, and unique."""
    return f"{(time.time() if now is None else now) + lifetime:.3f}", secrets.token_hex(16)


class Signable(Protocol):
    """A request signed whole: a config write, or an operator's decision to the registry."""

    signature: str | None

    def signed_part(self) -> bytes: ...


Signed = TypeVar("Signed", bound=BaseModel)


def config_signed_bytes(
    request: Signable, topicspace: str, expires: str, nonce: str, domain: str = CONFIG_WRITE_DOMAIN
) -> bytes:
    """What a config write's signature covers: the topicspace it is for, its expiry and nonce, and the request's
    canonical JSON (signature left out). A copy sent to another topicspace, or kept past its expiry, does not check;
    nor does one made for another `domain` (a decision is not a write)."""
    terms = {"domain": domain, "topicspace": topicspace, "expires": expires, "nonce": nonce}
    return canonical_json(terms).encode() + b"\n" + request.signed_part()


def config_signature_text(scheme: str, kid: str, topicspace: str, expires: str, nonce: str, raw: bytes) -> str:
    return f"{scheme}:{kid}:{expires}:{nonce}:{topicspace}:{base64.b64encode(raw).decode()}"


def sign_config_request(
    request: Signed,
    key: Ed25519PrivateKey,
    topicspace: str,
    now: float | None = None,
    lifetime: float = SIGNATURE_WINDOW,
    domain: str = CONFIG_WRITE_DOMAIN,
) -> Signed:
    """`request` (a `ConfigRequest`, or a `Signable` of another `domain`) with an operator's signature for
    `topicspace` (`ed25519-2:<key-id>:<expires>:<nonce>:<topicspace>:<base64>`)."""
    expires, nonce = config_signature_terms(now, lifetime)
    unsigned = request.model_copy(update={"signature": None})
    raw = key.sign(config_signed_bytes(cast(Signable, unsigned), topicspace, expires, nonce, domain))
    signature = config_signature_text(CONFIG_SIGNATURE, key_id(key.public_key()), topicspace, expires, nonce, raw)
    return unsigned.model_copy(update={"signature": signature})


def read_config_signature(signature: str) -> ConfigSignature:
    """The parts of a config write's signature; `SigningError` (one line: what is wrong, what to do) unless it is in
    the current form exactly: an older toolreg's signature (no topicspace, no expiry) or base64 that is not the
    canonical encoding of its bytes (changed padding bits, say: a copy made to look new) is refused."""
    parts = signature.split(":", 4)
    if len(parts) == 4 and parts[0] in OLDER_CONFIG_SCHEMES:
        raise SigningError(
            "the write is signed the older way (its signature names no topicspace and no expiry): upgrade toolreg"
            " where it was signed (`toolreg config put --signing-key`, or the registry) and sign it again"
        )
    topicspace, _, encoded = parts[-1].rpartition(":")
    if len(parts) != 5 or not topicspace:
        raise SigningError("its signature is not <scheme>:<key id>:<expires>:<nonce>:<topicspace>:<base64>")
    scheme, kid, expires, nonce = parts[:4]
    if not EXPIRES.match(expires) or not NONCE.match(nonce):
        raise SigningError("its signature's expiry or nonce is malformed")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise SigningError("its signature is not base64") from None
    if base64.b64encode(raw).decode() != encoded:
        raise SigningError("its signature is not in canonical base64 (changed padding bits?): a copy is refused")
    return ConfigSignature(scheme, kid, topicspace, expires, nonce, encoded, raw)


def verify_config_request(
    request: Signable, public: Ed25519PublicKey, topicspace: str, domain: str = CONFIG_WRITE_DOMAIN
) -> bool:
    """Whether `request` carries a valid operator signature by `public` for `topicspace` (the expiry is
    `check_expiry`'s)."""
    try:
        signature = read_config_signature(request.signature or "")
    except SigningError:
        return False
    if signature.scheme != CONFIG_SIGNATURE or signature.key_id != key_id(public):
        return False
    try:
        public.verify(
            signature.raw, config_signed_bytes(request, topicspace, signature.expires, signature.nonce, domain)
        )
    except InvalidSignature:
        return False
    return True


def check_expiry(expires: str, now: float | None = None, window: float = SIGNATURE_WINDOW) -> str | None:
    """None if a signature that `expires` then is good now; else why not.

    A signer makes it good for `window` seconds; its expiry may be up to
    another `window` ahead of this clock (the signer's clock may run ahead),
    never more: no signature is good for long.
    """
    try:
        when = float(expires)
    except ValueError:
        return "its expiry is not a number"
    left = when - (time.time() if now is None else now)
    if left < 0:
        return f"the signature expired {-left:.0f}s ago (a signed write is good for {window:g}s): sign it again"
    if left > 2 * window:
        return (
            f"its expiry is {left:.0f}s ahead, more than a signature may be good for ({window:g}s; is the signing"
            " machine's clock ahead?)"
        )
    return None


ANSWER_DOMAIN = b"toolreg-answer-1\n"
"""Bound into what an answer's signature covers, so bytes signed for anything else never check as an answer."""


def answer_signed_bytes(request_id: str, data: bytes) -> bytes:
    """What a service's signature on one answer covers: the request's id and the answer's bytes exactly as sent.

    The id binds the answer to its call (a copy replayed to another call does
    not check); the bytes are taken as they travel, so neither side encodes
    the body again to sign or check it.
    """
    return b"".join((ANSWER_DOMAIN, request_id.encode(), b"\n", data))


def answer_signer(key: Ed25519PrivateKey) -> Callable[[str, bytes], str]:
    """`sign(request_id, data)`: the `answer-signature` property of one answer, `<key-id>:<base64 signature>`."""
    prefix = key_id(key.public_key()) + ":"

    def sign_answer(request_id: str, data: bytes) -> str:
        return prefix + base64.b64encode(key.sign(answer_signed_bytes(request_id, data))).decode()

    return sign_answer


def answer_checker(public: Ed25519PublicKey) -> Callable[[str, bytes, str | None], str | None]:
    """`check(request_id, data, signature)`: None if `public` signed this answer to this request, else why not."""
    expected = key_id(public)

    def check_answer(request_id: str, data: bytes, signature: str | None) -> str | None:
        if not signature:
            return "unsigned"
        kid, _, encoded = signature.partition(":")
        if kid != expected:
            return f"signed by key {kid[:16]}, not the service's {expected}"
        try:
            public.verify(base64.b64decode(encoded, validate=True), answer_signed_bytes(request_id, data))
        except (InvalidSignature, binascii.Error, ValueError):
            return "bad signature"
        return None

    return check_answer

"""Ed25519 signatures on announcements, and on writes to the config store.

A signature covers the canonical JSON of the announcement without its
`signature` field, so any change to any field (a tool description, the
sequence, the time) breaks it. The field holds `<key-id>:<base64 signature>`;
the key id (16 hex digits of the public key's sha256) lets the registry pick
the key without trying each one, and never stands in for it: the policy
stores full public keys.

A config write (`ConfigRequest`, `toolreg config put --signing-key`) is signed
the same way, over its canonical JSON and the time it was signed: its
`signature` field holds `ed25519:<key-id>:<signed-at>:<base64 signature>`. A
store whose trust policy covers the config queue takes writes of `tool` and
`tool-service` items only when an operator key of the policy signed them,
recently (`check_signed_at`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import time
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from .errors import ToolDiscoveryError
from .schemas import Announcement, ConfigRequest, canonical_json

CONFIG_SIGNATURE = "ed25519"
"""The scheme of an operator's signature on a config write (the registry's is its group key's, `group`)."""
SIGNATURE_WINDOW = 60.0
"""Seconds a signed config write is good for, either side of the store's clock: a copy replayed later is refused."""


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


def config_signed_bytes(request: ConfigRequest, signed_at: str) -> bytes:
    """What a config write's signature covers: its canonical JSON (signature left out) and when it was signed."""
    return request.signed_part() + b"\n" + signed_at.encode()


def sign_config_request(request: ConfigRequest, key: Ed25519PrivateKey, now: float | None = None) -> ConfigRequest:
    """`request` with an operator's signature (`ed25519:<key-id>:<signed-at>:<base64>`)."""
    signed_at = f"{time.time() if now is None else now:.3f}"
    unsigned = request.model_copy(update={"signature": None})
    signature = base64.b64encode(key.sign(config_signed_bytes(unsigned, signed_at))).decode()
    return unsigned.model_copy(
        update={"signature": f"{CONFIG_SIGNATURE}:{key_id(key.public_key())}:{signed_at}:{signature}"}
    )


def split_config_signature(signature: str | None) -> tuple[str, str, str, str] | None:
    """(scheme, key id, signed-at, signature) of a config write's signature; None if it has none, or not that shape."""
    if not signature or signature.count(":") < 3:
        return None
    scheme, kid, signed_at, encoded = signature.split(":", 3)
    return scheme, kid, signed_at, encoded


def verify_config_request(request: ConfigRequest, public: Ed25519PublicKey) -> bool:
    """Whether `request` carries a valid operator signature by `public` (freshness is `check_signed_at`'s)."""
    parts = split_config_signature(request.signature)
    if parts is None or parts[0] != CONFIG_SIGNATURE or parts[1] != key_id(public):
        return False
    try:
        public.verify(base64.b64decode(parts[3], validate=True), config_signed_bytes(request, parts[2]))
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


def check_signed_at(signed_at: str, now: float | None = None, window: float = SIGNATURE_WINDOW) -> str | None:
    """None if a signature made at `signed_at` is recent enough; else why not."""
    try:
        when = float(signed_at)
    except ValueError:
        return "its signing time is not a number"
    skew = (time.time() if now is None else now) - when
    if not -window <= skew <= window:
        return f"it was signed {skew:+.0f}s from now, outside the {window:g}s a signature is good for (a replay?)"
    return None

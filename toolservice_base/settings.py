"""The one place the product reads its environment.

A process finds its broker in this order: an explicit URL, `PULSAR_URL`,
then the `broker.url` file that `toolreg up` writes under the data directory.
That file is what lets every command on a laptop find the embedded broker
without the user exporting anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DATA_DIR = ".toolreg"
BROKER_URL_FILE = "broker.url"


class NoBrokerError(RuntimeError):
    """No broker is configured and none is running under the data directory."""


def _read_token() -> str | None:
    token = os.environ.get("PULSAR_AUTH_TOKEN")
    if token:
        return token.strip()
    path = os.environ.get("PULSAR_AUTH_TOKEN_FILE")
    if path:
        try:
            return Path(path).read_text().strip() or None
        except OSError as exc:
            raise NoBrokerError(
                f"cannot read PULSAR_AUTH_TOKEN_FILE {path!r}: {exc.strerror}; fix the path or unset it"
            ) from exc
    return None


@dataclass(frozen=True)
class Settings:
    """Where the data lives and how to reach the broker."""

    data_dir: Path = field(default_factory=lambda: Path(DEFAULT_DATA_DIR))
    pulsar_url: str | None = None
    auth_token: str | None = None
    signing_key_file: Path | None = None

    @classmethod
    def from_env(cls, data_dir: str | Path | None = None, pulsar_url: str | None = None) -> "Settings":
        directory = data_dir or os.environ.get("TOOLREG_DATA_DIR") or DEFAULT_DATA_DIR
        return cls(
            data_dir=Path(directory),
            pulsar_url=pulsar_url or os.environ.get("PULSAR_URL") or None,
            auth_token=_read_token(),
            signing_key_file=Path(os.environ["TOOLREG_SIGNING_KEY"]) if os.environ.get("TOOLREG_SIGNING_KEY") else None,
        )

    @property
    def broker_url_file(self) -> Path:
        return self.data_dir / BROKER_URL_FILE

    def resolve_pulsar_url(self) -> str:
        """The broker to talk to, or a one-line error saying how to get one."""
        if self.pulsar_url:
            return self.pulsar_url
        try:
            url = self.broker_url_file.read_text().strip()
        except FileNotFoundError:
            url = ""
        if url:
            return url
        raise NoBrokerError(
            f"no broker: set PULSAR_URL, or run `toolreg up` (no {self.broker_url_file} found)"
        )

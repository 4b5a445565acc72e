"""The one place the product reads its environment.

A process finds its broker in this order: an explicit URL, `PULSAR_URL`,
then the `broker.url` file that `toolreg up` writes under the data directory.
That file is what lets every command on a laptop find the embedded broker
without the user exporting anything.

The broker's kind decides which workarounds the transport turns on
(`transport.Capabilities`): the embedded broker's URL file says pulsar-lite;
a `PULSAR_URL` broker is Apache Pulsar unless `TOOLREG_BROKER` says
`pulsar-lite`; a `memory://` URL is the in-process broker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import NoBrokerError
from .topics import DEFAULT_TOPICSPACE, Topics, check_topicspace

DEFAULT_DATA_DIR = ".toolreg"
BROKERS = ("apache-pulsar", "pulsar-lite")
BROKER_URL_FILE = "broker.url"


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
    broker: str | None = None
    """`apache-pulsar` or `pulsar-lite`; None: decided from where the URL came from (see the module)."""
    topicspace: str = DEFAULT_TOPICSPACE
    operation_timeout: int = 10
    """Seconds pulsar-client waits for the broker on one operation (subscribe, create a producer)."""

    def __post_init__(self) -> None:
        check_topicspace(self.topicspace)
        if self.broker is not None and self.broker not in BROKERS:
            raise NoBrokerError(f"TOOLREG_BROKER={self.broker!r} is not a broker kind; use one of {', '.join(BROKERS)}")

    @classmethod
    def from_env(
        cls, data_dir: str | Path | None = None, pulsar_url: str | None = None, topicspace: str | None = None
    ) -> "Settings":
        directory = data_dir or os.environ.get("TOOLREG_DATA_DIR") or DEFAULT_DATA_DIR
        space = topicspace or os.environ.get("TOOLREG_TOPICSPACE", "").strip() or DEFAULT_TOPICSPACE
        try:
            check_topicspace(space)
        except ValueError as exc:
            raise NoBrokerError(f"{exc}; fix TOOLREG_TOPICSPACE or --topicspace") from None
        return cls(
            data_dir=Path(directory),
            pulsar_url=pulsar_url or os.environ.get("PULSAR_URL") or None,
            auth_token=_read_token(),
            signing_key_file=Path(os.environ["TOOLREG_SIGNING_KEY"]) if os.environ.get("TOOLREG_SIGNING_KEY") else None,
            broker=os.environ.get("TOOLREG_BROKER", "").strip() or None,
            topicspace=space,
        )

    @property
    def topics(self) -> Topics:
        return Topics(self.topicspace)

    def broker_kind(self, url: str) -> str:
        """Which broker `url` is: the transport turns on that broker's workarounds, and only those."""
        if url.startswith("memory://"):
            return "memory"
        if self.broker:
            return self.broker
        if not self.pulsar_url and self._url_file_names(url):
            return "pulsar-lite"  # the embedded broker that `toolreg up` started
        return "apache-pulsar"

    def _url_file_names(self, url: str) -> bool:
        try:
            return self.broker_url_file.read_text().strip() == url
        except OSError:
            return False

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

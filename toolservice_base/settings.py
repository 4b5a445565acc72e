"""What every process reads to reach the broker, and the variables read at the moment they are needed.

A process finds its broker in this order: an explicit URL, `PULSAR_URL`,
then the `broker.url` file that `toolreg up` writes under the data directory.
That file is what lets every command on a laptop find the embedded broker
without the user exporting anything.

The broker's kind decides which workarounds the transport turns on
(`transport.Capabilities`): the embedded broker's URL file says pulsar-lite;
a `PULSAR_URL` broker is Apache Pulsar unless `TOOLREG_BROKER` says
`pulsar-lite`; a `memory://` URL is the in-process broker.

The floor holds only that: every other setting belongs to the part of the product that reads it, in its own
package (`discovery.mcp.settings` for the MCP front, `discovery.registry.settings`, `discovery.store.settings`,
`discovery.web.settings`, `discovery.broker.settings` for the admin API, `toolservice_base.search.settings`,
`toolservice_base.mcp_service.settings`), each variable declared once (`toolservice_base.variables`). A value
the product cannot use is one line naming the variable (`SettingsError`). Logging and the event loop are read by
a small function here, at the moment they are needed (a process, or a test, may set them after import); the
standard `OTEL_*` variables `toolreg` decides its tracing by are read beside the tracing, in
`toolservice_base.tracing`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .brokers import APACHE_PULSAR, MEMORY, NETWORK_BROKERS, PULSAR_LITE
from .errors import NoBrokerError, ToolDiscoveryError
from .topics import DEFAULT_TOPICSPACE, Topics, check_topicspace
from .variables import Variable, file_contents, path, read, setting, text, variables

DEFAULT_DATA_DIR = ".toolreg"
BROKER_URL_FILE = "broker.url"

AUTH_TOKEN_FILE = Variable(
    "PULSAR_AUTH_TOKEN_FILE",
    file_contents(NoBrokerError),
    None,
    "a file holding the JWT sent to the broker, read once at start; used when PULSAR_AUTH_TOKEN is unset",
)


MOVED: dict[str, str] = {
    "mcp_token": "discovery.mcp.settings.McpSettings.from_env().token",
    "mcp_oauth_issuer": "discovery.mcp.settings.McpSettings.from_env().oauth_issuer",
    "mcp_resource": "discovery.mcp.settings.McpSettings.from_env().resource",
    "mcp_jwks_uri": "discovery.mcp.settings.McpSettings.from_env().jwks_uri",
    "mcp_introspection_client": "discovery.mcp.settings.McpSettings.from_env().introspection_client",
    "mcp_introspection_secret": "discovery.mcp.settings.McpSettings.from_env().introspection_secret",
    "mcp_token_algorithms": "discovery.mcp.settings.McpSettings.from_env().token_algorithms",
    "mcp_clock_skew": "discovery.mcp.settings.McpSettings.from_env().clock_skew",
    "mcp_policy": "discovery.mcp.settings.McpSettings.from_env().policy",
    "mcp_rate_limit": "discovery.mcp.settings.McpSettings.from_env().rate_limit",
    "mcp_audit_topic": "discovery.mcp.settings.McpSettings.from_env().audit_topic",
    "mcp_audit_arguments": "discovery.mcp.settings.McpSettings.from_env().audit_arguments",
    "mcp_audit_key": "discovery.mcp.settings.McpSettings.from_env().audit_key",
    "mcp_session_idle": "discovery.mcp.settings.McpSettings.from_env().session_idle",
    "mcp_max_sessions": "discovery.mcp.settings.McpSettings.from_env().max_sessions",
    "trust_policy": "discovery.registry.settings.RegistrySettings.from_env().trust_policy",
    "allowed_namespaces": "discovery.registry.settings.RegistrySettings.from_env().allowed_namespaces",
    "max_clock_skew": "discovery.registry.settings.RegistrySettings.from_env().max_clock_skew",
    "max_instances": "discovery.registry.settings.RegistrySettings.from_env().max_instances",
    "pin_definitions": "discovery.registry.settings.RegistrySettings.from_env().pin_definitions",
    "store": "discovery.store.settings.StoreSettings.from_env().backend",
    "change_window_keys": "discovery.store.settings.StoreSettings.from_env().change_window_keys",
    "change_window_bytes": "discovery.store.settings.StoreSettings.from_env().change_window_bytes",
    "group_key_file": "discovery.replicas.settings.ReplicaSettings.from_env().group_key_file",
    "metrics_port": "discovery.web.settings.HttpSettings.from_env().metrics_port",
    "metrics_host": "discovery.web.settings.HttpSettings.from_env().metrics_host",
    "http_token": "discovery.web.settings.HttpSettings.from_env().http_token",
    "admin_url": "discovery.broker.settings.AdminSettings.from_env().admin_url",
    "admin_token": "discovery.broker.settings.AdminSettings.from_env().admin_token",
    "cluster": "discovery.broker.settings.AdminSettings.from_env().cluster",
    "audit_retention": "discovery.broker.settings.AdminSettings.from_env().audit_retention",
    "search_embedder": "toolservice_base.search.settings.SearchSettings.from_env().embedder",
    "search_embedder_key": "toolservice_base.search.settings.SearchSettings.from_env().embedder_key",
    "mcp_max_message": "toolservice_base.mcp_service.settings.SidecarSettings.from_env().max_message",
}
"""Where each field `Settings` held before it kept only the broker's went: a part's own settings class, read as
given here. The environment variables did not change; only who reads them."""


@dataclass(frozen=True)
class Settings:
    """Where the data lives and how to reach the broker: what every process reads."""

    data_dir: Path = setting(
        "TOOLREG_DATA_DIR", path, Path(DEFAULT_DATA_DIR), "the store's file, broker.url, up.lock, the snapshots"
    )
    pulsar_url: str | None = setting("PULSAR_URL", text, None, "the broker; None: the data directory's broker.url")
    auth_token: str | None = setting("PULSAR_AUTH_TOKEN", text, None, "a JWT sent to the broker")
    signing_key_file: Path | None = setting(
        "TOOLREG_SIGNING_KEY", path, None, "the Ed25519 private key a service signs its announcements with"
    )
    broker: str | None = setting(
        "TOOLREG_BROKER", text, None, "`apache-pulsar` or `pulsar-lite`; None: decided from where the URL came from"
    )
    topicspace: str = setting("TOOLREG_TOPICSPACE", text, DEFAULT_TOPICSPACE, "the Pulsar tenant every topic lives in")
    operation_timeout: int = 10
    """Seconds pulsar-client waits for the broker on one operation (subscribe, create a producer)."""

    def __post_init__(self) -> None:
        check_topicspace(self.topicspace)
        if self.broker is not None and self.broker not in NETWORK_BROKERS:
            kinds = ", ".join(NETWORK_BROKERS)
            raise NoBrokerError(f"TOOLREG_BROKER={self.broker!r} is not a broker kind; use one of {kinds}")

    @classmethod
    def from_env(
        cls,
        data_dir: str | Path | None = None,
        pulsar_url: str | None = None,
        topicspace: str | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> "Settings":
        """The environment's settings (`environ`, else `os.environ`); the arguments (a command's flags) win."""
        values = read(cls, environ)
        space = topicspace or values["topicspace"]
        try:
            check_topicspace(space)
        except ValueError as exc:
            raise NoBrokerError(f"{exc}; fix TOOLREG_TOPICSPACE or --topicspace") from None
        return cls(
            **{
                **values,
                "data_dir": Path(data_dir) if data_dir else values["data_dir"],
                "pulsar_url": pulsar_url or values["pulsar_url"],
                "auth_token": values["auth_token"] or AUTH_TOKEN_FILE.read(environ),
                "topicspace": space,
            }
        )

    def __getattr__(self, name: str) -> object:
        """A field that moved to its part's settings says where it went, in one line, instead of a bare
        AttributeError."""
        if name in MOVED:
            raise AttributeError(
                f"Settings.{name} moved: read it with {MOVED[name]} (same environment variable)", name=name, obj=self
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)

    @property
    def topics(self) -> Topics:
        return Topics(self.topicspace)

    def broker_kind(self, url: str) -> str:
        """Which broker `url` is: the transport turns on that broker's workarounds, and only those."""
        if url.startswith("memory://"):
            return MEMORY
        if self.broker:
            return self.broker
        if not self.pulsar_url and self._url_file_names(url):
            return PULSAR_LITE  # the embedded broker that `toolreg up` started
        return APACHE_PULSAR

    def _url_file_names(self, url: str) -> bool:
        try:
            return self.broker_url_file.read_text().strip() == url
        except OSError:
            return False

    @property
    def broker_url_file(self) -> Path:
        return self.data_dir / BROKER_URL_FILE

    def child_env(self, **extra: str) -> dict[str, str]:
        """This process's environment, pointed at the same broker, data directory and topicspace: for a child
        process (a `toolreg serve`) that must reach what this one reaches. `extra` adds or replaces variables."""
        name = {field: variable.name for field, variable in variables(Settings).items()}
        return {
            **os.environ,
            name["pulsar_url"]: self.resolve_pulsar_url(),
            name["data_dir"]: str(self.data_dir),
            name["broker"]: self.broker or "",
            name["topicspace"]: self.topicspace,
            **extra,
        }

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
            f"no broker: set PULSAR_URL, or run `toolreg up` (no {self.broker_url_file} found: `toolreg up` writes"
            " its broker's URL in its data directory, so run this command from the same directory or give it the"
            " same --data-dir or TOOLREG_DATA_DIR)"
        )


# --- read when needed: logging, the event loop -------------------------------------------

LOG_LEVEL = Variable("TOOLREG_LOG_LEVEL", text, None, "`debug`, `info`, `warning` or `error`; None: info")
LOG_FORMAT = Variable(
    "TOOLREG_LOG_FORMAT", lambda name, value: value.lower(), "", '`json` or `console`; "": JSON off a terminal'
)


def _present(name: str, value: str) -> bool:
    return True


NO_COLOR = Variable("NO_COLOR", _present, False, "set to anything: console logs without colours")
EVENT_LOOPS = ("uvloop", "asyncio")


def _loop(name: str, value: str) -> str:
    chosen = value.lower()
    if chosen not in EVENT_LOOPS:
        raise ToolDiscoveryError(f"{name}={chosen!r}: use uvloop or asyncio")
    return chosen


EVENT_LOOP = Variable("TOOLREG_EVENT_LOOP", _loop, "", '`uvloop` or `asyncio`; "": uvloop where it is installed')


def log_level() -> str | None:
    """`TOOLREG_LOG_LEVEL`: `debug`, `info`, `warning` or `error`, as given; None when unset or empty (info)."""
    return LOG_LEVEL.read()


def log_format() -> str:
    """`TOOLREG_LOG_FORMAT`, lower-cased: `json` or `console`; "" when unset (then the stream decides: JSON off a
    terminal)."""
    return LOG_FORMAT.read()


def no_color() -> bool:
    """`NO_COLOR` set to anything (no-color.org): console logs without colours, even on a terminal."""
    return NO_COLOR.read()


def event_loop() -> str:
    """`TOOLREG_EVENT_LOOP`: `uvloop` or `asyncio`; unset, uvloop where it is installed (`tool-discovery[uvloop]`), else
    asyncio.

    Raises `ToolDiscoveryError` for another value, or for `uvloop` when it is not installed.
    """
    chosen = EVENT_LOOP.read()
    installed = importlib.util.find_spec("uvloop") is not None
    if chosen == "uvloop" and not installed:
        raise ToolDiscoveryError(
            f"{EVENT_LOOP.name}=uvloop, but uvloop is not installed: pip install 'tool-discovery[uvloop]'"
        )
    return chosen or ("uvloop" if installed else "asyncio")

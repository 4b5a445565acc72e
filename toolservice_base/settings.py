"""The one place the product reads its environment.

A process finds its broker in this order: an explicit URL, `PULSAR_URL`,
then the `broker.url` file that `toolreg up` writes under the data directory.
That file is what lets every command on a laptop find the embedded broker
without the user exporting anything.

The broker's kind decides which workarounds the transport turns on
(`transport.Capabilities`): the embedded broker's URL file says pulsar-lite;
a `PULSAR_URL` broker is Apache Pulsar unless `TOOLREG_BROKER` says
`pulsar-lite`; a `memory://` URL is the in-process broker.

What is not about reaching the broker is a typed field of `Settings` too,
read and checked once by `Settings.from_env`: the HTTP surface (metrics port
and host, the page's and the MCP front's bearer tokens and session limits),
the registry's tuning (trust policy, allowed namespaces, clock skew, instance
cap, pinned definitions) and the replicas' group key. A value the product
cannot use is one line naming the variable (`SettingsError`). Only what must be read before any `Settings` exists, or
at the moment it is needed (a process, or a test, may set it after import),
is read by a small function here: logging and the event loop (the standard
`OTEL_*` variables `toolreg` decides its tracing by are read beside the
tracing, in `toolservice_base.tracing`). Every variable read here is
described in docs/operators.md (tests/deploy/test_deploy.py checks).
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from .brokers import APACHE_PULSAR, MEMORY, NETWORK_BROKERS, PULSAR_LITE
from .errors import NoBrokerError, SettingsError, ToolDiscoveryError
from .topics import DEFAULT_TOPICSPACE, Topics, check_topicspace

DEFAULT_DATA_DIR = ".toolreg"
BROKER_URL_FILE = "broker.url"
MCP_TOKEN_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
"""Asymmetric JWS algorithms only: a key published in a JWKS is public, so an HMAC (`HS*`) token checked against one
could be forged by anyone, and `none` is no signature."""
MCP_CLOCK_SKEW = 30.0
DEFAULT_EMBEDDER = "wordllama"
WORDS_ONLY = "bm25"
MAX_MCP_CLOCK_SKEW = 300.0


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
    store: str | None = None
    """`toolreg up`'s config store backend (TOOLREG_STORE): `sqlite` (the default) or `pulsar` (replicated on Apache
    Pulsar)."""
    metrics_port: int | None = None
    """TOOLREG_METRICS_PORT: serve /healthz, /readyz and /metrics on it (0 picks a free one); None: off."""
    metrics_host: str | None = None
    """TOOLREG_METRICS_HOST: the address to bind that port to; None: loopback (containers set 0.0.0.0)."""
    http_token: str | None = None
    """TOOLREG_HTTP_TOKEN: the bearer token the registry page asks for when it is served off loopback."""
    mcp_token: str | None = None
    """TOOLREG_MCP_TOKEN: the bearer token `toolreg mcp --http` asks for (unless --token-file)."""
    trust_policy: Path | None = None
    """TOOLREG_TRUST_POLICY: the registry's trust policy file (`toolreg trust` edits it); None: no policy."""
    allowed_namespaces: tuple[str, ...] | None = None
    """TOOLREG_ALLOWED_NAMESPACES (comma-separated): where announced queues may live; None: the topicspace's own."""
    max_clock_skew: float | None = None
    """TOOLREG_MAX_CLOCK_SKEW: seconds an announcement's clock may be ahead; None: the registry's default."""
    max_instances: int | None = None
    """TOOLREG_MAX_INSTANCES: instance leases the registry holds at most; None: the registry's default."""
    pin_definitions: bool = False
    """TOOLREG_PIN_DEFINITIONS (1, true or yes): pin each announced tool's definition (`--pin-definitions`)."""
    mcp_oauth_issuer: str | None = None
    """TOOLREG_MCP_OAUTH_ISSUER: `toolreg mcp --http` is an OAuth 2.1 resource server for tokens of this issuer."""
    mcp_resource: str | None = None
    """TOOLREG_MCP_RESOURCE: the front's canonical resource URI (tokens' audience); None: the URL it serves."""
    mcp_jwks_uri: str | None = None
    """TOOLREG_MCP_JWKS_URI: where the issuer's signing keys are; None: its metadata's `jwks_uri`."""
    mcp_introspection_client: str | None = None
    """TOOLREG_MCP_INTROSPECTION_CLIENT: the client id the front introspects opaque tokens as (RFC 7662)."""
    mcp_introspection_secret: str | None = None
    """TOOLREG_MCP_INTROSPECTION_SECRET: that client's secret."""
    mcp_token_algorithms: tuple[str, ...] = MCP_TOKEN_ALGORITHMS
    """TOOLREG_MCP_TOKEN_ALGORITHMS (comma-separated): the JWS algorithms an access token may be signed with."""
    mcp_clock_skew: float = MCP_CLOCK_SKEW
    """TOOLREG_MCP_CLOCK_SKEW: seconds a token's `exp` and `nbf` may be off by (0 to 300)."""
    mcp_policy: Path | None = None
    """TOOLREG_MCP_POLICY: the front's access policy (scopes and claims to tools); None: every token, every tool."""
    mcp_rate_limit: float | None = None
    """TOOLREG_MCP_RATE_LIMIT: tool calls per second each caller may make through the front; None: no limit."""
    mcp_audit_topic: bool = False
    """TOOLREG_MCP_AUDIT_TOPIC (1, true or yes): every call through the front is also published on the audit topic."""
    mcp_audit_arguments: bool = False
    """TOOLREG_MCP_AUDIT_ARGUMENTS (1, true or yes): audit records carry the call's arguments."""
    mcp_audit_key: Path | None = None
    """TOOLREG_MCP_AUDIT_KEY: the front's Ed25519 key file (`toolreg keygen`): each audit record it publishes is signed
    and chained with it, so verifiers that trust its public key (`toolreg trust add-front`) tell it from forgeries.
    None: records are published unsigned, and verifiers ignore them."""
    admin_url: str | None = None
    """PULSAR_ADMIN_URL: Apache Pulsar's admin API, for `toolreg init`; None: port 8080 of the PULSAR_URL host."""
    admin_token: str | None = None
    """The contents of PULSAR_ADMIN_TOKEN_FILE: a superuser's token for the admin API; None: PULSAR_AUTH_TOKEN's."""
    cluster: str | None = None
    """PULSAR_CLUSTER: the cluster a tenant `toolreg init` makes may use; None: the cluster's own, if it has one."""
    audit_retention: str | None = None
    """TOOLREG_AUDIT_RETENTION: how long `toolreg init` has the audit namespace keep records (`30d`); None: 30 days."""
    group_key_file: Path | None = None
    """TOOLREG_GROUP_KEY: the replicas' group key file (`toolreg group-key new`): every record they write on the state
    topics is signed with it, and one that is not is refused. None: the broker's permissions alone protect them."""
    mcp_max_message: int | None = None
    """TOOLREG_MCP_MAX_MESSAGE: bytes one message of an HTTP MCP server behind `toolreg announce --mcp-url` may hold;
    None: the broker's message limit (5 MiB)."""
    mcp_session_idle: float = 300.0
    """TOOLREG_MCP_SESSION_IDLE: seconds an MCP HTTP session may go without a request before it is closed and
    forgotten (its client starts a new one)."""
    mcp_max_sessions: int = 1000
    """TOOLREG_MCP_MAX_SESSIONS: MCP HTTP sessions open at once; a new one past it is refused (503) until one ends or
    expires."""
    change_window_keys: int = 100_000
    """TOOLREG_CHANGE_WINDOW_KEYS: changed keys the config store's change feed remembers; a reader further behind
    reads everything (its tools, not the whole store) once."""
    search_embedder: str = "wordllama"
    """TOOLREG_SEARCH_EMBEDDER: what search embeds tools and queries with (`toolservice_base.search.embedding`):
    `wordllama` (shipped in its wheel, offline), `bm25` (words only), `sentence-transformers:<model>`,
    `fastembed:<model>`, `openai:<model>@<base-url>` or `<module>:<attribute>`."""
    search_embedder_key: str | None = None
    """TOOLREG_SEARCH_EMBEDDER_KEY: the bearer token an `openai:` embeddings endpoint is sent."""
    change_window_bytes: int = 16 * 1024 * 1024
    """TOOLREG_CHANGE_WINDOW_BYTES: about how many bytes of key names the change feed keeps, whichever bound is hit
    first."""

    def __post_init__(self) -> None:
        check_topicspace(self.topicspace)
        if self.broker is not None and self.broker not in NETWORK_BROKERS:
            kinds = ", ".join(NETWORK_BROKERS)
            raise NoBrokerError(f"TOOLREG_BROKER={self.broker!r} is not a broker kind; use one of {kinds}")
        if not (math.isfinite(self.mcp_session_idle) and self.mcp_session_idle > 0):
            raise SettingsError(f"{MCP_SESSION_IDLE_ENV}={self.mcp_session_idle!r}: give a positive number of seconds")
        if self.mcp_max_sessions < 1:
            raise SettingsError(f"{MCP_MAX_SESSIONS_ENV}={self.mcp_max_sessions!r}: give at least 1")
        if self.mcp_max_message is not None and self.mcp_max_message < 1024:
            raise SettingsError(f"{MCP_MAX_MESSAGE_ENV}={self.mcp_max_message!r}: give at least 1024 bytes")
        check_embedder(self.search_embedder)
        if min(self.change_window_keys, self.change_window_bytes) < 1:
            raise SettingsError(f"{CHANGE_WINDOW_KEYS_ENV} and {CHANGE_WINDOW_BYTES_ENV} must be at least 1")

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
            store=os.environ.get("TOOLREG_STORE", "").strip() or None,
            group_key_file=Path(key) if (key := _env(GROUP_KEY_ENV)) else None,
            search_embedder=_env(SEARCH_EMBEDDER_ENV) or DEFAULT_EMBEDDER,
            search_embedder_key=_env(SEARCH_EMBEDDER_KEY_ENV),
            **_change_window_env(),
            **_serving_env(),
            **_registry_env(),
            **_mcp_env(),
            **_admin_env(),
        )

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
        return {
            **os.environ,
            "PULSAR_URL": self.resolve_pulsar_url(),
            "TOOLREG_DATA_DIR": str(self.data_dir),
            "TOOLREG_BROKER": self.broker or "",
            "TOOLREG_TOPICSPACE": self.topicspace,
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


# --- the HTTP surface and the registry's tuning: fields of Settings ---------------------


METRICS_PORT_ENV = "TOOLREG_METRICS_PORT"
METRICS_HOST_ENV = "TOOLREG_METRICS_HOST"
HTTP_TOKEN_ENV = "TOOLREG_HTTP_TOKEN"
MCP_TOKEN_ENV = "TOOLREG_MCP_TOKEN"
TRUST_POLICY_ENV = "TOOLREG_TRUST_POLICY"
ALLOWED_NAMESPACES_ENV = "TOOLREG_ALLOWED_NAMESPACES"
MAX_CLOCK_SKEW_ENV = "TOOLREG_MAX_CLOCK_SKEW"
MAX_INSTANCES_ENV = "TOOLREG_MAX_INSTANCES"
PIN_DEFINITIONS_ENV = "TOOLREG_PIN_DEFINITIONS"
ADMIN_URL_ENV = "PULSAR_ADMIN_URL"
ADMIN_TOKEN_FILE_ENV = "PULSAR_ADMIN_TOKEN_FILE"
CLUSTER_ENV = "PULSAR_CLUSTER"
AUDIT_RETENTION_ENV = "TOOLREG_AUDIT_RETENTION"
GROUP_KEY_ENV = "TOOLREG_GROUP_KEY"
SEARCH_EMBEDDER_ENV = "TOOLREG_SEARCH_EMBEDDER"
SEARCH_EMBEDDER_KEY_ENV = "TOOLREG_SEARCH_EMBEDDER_KEY"
MCP_SESSION_IDLE_ENV = "TOOLREG_MCP_SESSION_IDLE"
MCP_MAX_SESSIONS_ENV = "TOOLREG_MCP_MAX_SESSIONS"
MCP_MAX_MESSAGE_ENV = "TOOLREG_MCP_MAX_MESSAGE"
CHANGE_WINDOW_KEYS_ENV = "TOOLREG_CHANGE_WINDOW_KEYS"
CHANGE_WINDOW_BYTES_ENV = "TOOLREG_CHANGE_WINDOW_BYTES"


MCP_OAUTH_ISSUER_ENV = "TOOLREG_MCP_OAUTH_ISSUER"
MCP_RESOURCE_ENV = "TOOLREG_MCP_RESOURCE"
MCP_JWKS_URI_ENV = "TOOLREG_MCP_JWKS_URI"
MCP_INTROSPECTION_CLIENT_ENV = "TOOLREG_MCP_INTROSPECTION_CLIENT"
MCP_INTROSPECTION_SECRET_ENV = "TOOLREG_MCP_INTROSPECTION_SECRET"
MCP_TOKEN_ALGORITHMS_ENV = "TOOLREG_MCP_TOKEN_ALGORITHMS"
MCP_CLOCK_SKEW_ENV = "TOOLREG_MCP_CLOCK_SKEW"
MCP_POLICY_ENV = "TOOLREG_MCP_POLICY"
MCP_RATE_LIMIT_ENV = "TOOLREG_MCP_RATE_LIMIT"
MCP_AUDIT_TOPIC_ENV = "TOOLREG_MCP_AUDIT_TOPIC"
MCP_AUDIT_ARGUMENTS_ENV = "TOOLREG_MCP_AUDIT_ARGUMENTS"
MCP_AUDIT_KEY_ENV = "TOOLREG_MCP_AUDIT_KEY"


def check_embedder(spec: str) -> str:
    """`spec` if it has the form of an embedder's name (`toolservice_base.search.embedding`), else one line saying
    which forms do."""
    kind, _, rest = spec.partition(":")
    if spec in (DEFAULT_EMBEDDER, WORDS_ONLY) or (rest and (kind != "openai" or "@" in rest)):
        return spec
    raise SettingsError(
        f"{SEARCH_EMBEDDER_ENV}={spec!r} is not an embedder; use wordllama, bm25, sentence-transformers:<model>,"
        " fastembed:<model>, openai:<model>@<base-url> or <module>:<attribute>"
    )


def _env(name: str) -> str | None:
    """One variable of the environment, stripped; None if unset or blank."""
    return os.environ.get(name, "").strip() or None


class _Serving(TypedDict):
    metrics_port: int | None
    metrics_host: str | None
    http_token: str | None
    mcp_token: str | None


class _Registry(TypedDict):
    trust_policy: Path | None
    allowed_namespaces: tuple[str, ...] | None
    max_clock_skew: float | None
    max_instances: int | None
    pin_definitions: bool


def _whole(name: str, what: str = "") -> int | None:
    """A whole number from the environment variable `name`; None when unset."""
    text = _env(name)
    try:
        return int(text) if text is not None else None
    except ValueError:
        raise SettingsError(f"{name}={text!r} is not a whole number{what}") from None


def _change_window_env() -> dict[str, int]:
    window = {
        "change_window_keys": _whole(CHANGE_WINDOW_KEYS_ENV),
        "change_window_bytes": _whole(CHANGE_WINDOW_BYTES_ENV),
    }
    return {field: value for field, value in window.items() if value is not None}


def _serving_env() -> _Serving:
    return {
        "metrics_port": _whole(METRICS_PORT_ENV, " (a port)"),
        "metrics_host": _env(METRICS_HOST_ENV),
        "http_token": _env(HTTP_TOKEN_ENV),
        "mcp_token": _env(MCP_TOKEN_ENV),
    }


def _registry_env() -> _Registry:
    namespaces = [item.strip() for item in (_env(ALLOWED_NAMESPACES_ENV) or "").split(",") if item.strip()]
    skew_text = _env(MAX_CLOCK_SKEW_ENV)
    try:
        skew = float(skew_text) if skew_text else None
    except ValueError:
        raise SettingsError(f"{MAX_CLOCK_SKEW_ENV}={skew_text!r} is not a number of seconds") from None
    policy = os.environ.get(TRUST_POLICY_ENV) or None
    return {
        "trust_policy": Path(policy) if policy else None,
        "allowed_namespaces": tuple(namespaces) or None,
        "max_clock_skew": skew,
        "max_instances": _whole(MAX_INSTANCES_ENV, " of instances"),
        "pin_definitions": _flag(PIN_DEFINITIONS_ENV),
    }


class _Mcp(TypedDict):
    mcp_oauth_issuer: str | None
    mcp_resource: str | None
    mcp_jwks_uri: str | None
    mcp_introspection_client: str | None
    mcp_introspection_secret: str | None
    mcp_token_algorithms: tuple[str, ...]
    mcp_clock_skew: float
    mcp_policy: Path | None
    mcp_rate_limit: float | None
    mcp_audit_topic: bool
    mcp_audit_arguments: bool
    mcp_audit_key: Path | None
    mcp_session_idle: float
    mcp_max_sessions: int
    mcp_max_message: int | None


def _flag(name: str) -> bool:
    return (_env(name) or "").lower() in ("1", "true", "yes")


def _number(name: str, what: str, low: float, high: float) -> float | None:
    text = _env(name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"{name}={text!r} is not a number of {what}") from None
    if not low <= value <= high:  # NaN fails this too
        raise SettingsError(f"{name}={text!r} is out of range: use {low:g} to {high:g} {what}")
    return value


def _mcp_env() -> _Mcp:
    algorithms = tuple(a.strip() for a in (_env(MCP_TOKEN_ALGORITHMS_ENV) or "").split(",") if a.strip())
    unsafe = [a for a in algorithms if a not in MCP_TOKEN_ALGORITHMS]
    if unsafe:
        raise SettingsError(
            f"{MCP_TOKEN_ALGORITHMS_ENV} names {', '.join(unsafe)}: access tokens are checked against the issuer's "
            f"public keys, so only {', '.join(MCP_TOKEN_ALGORITHMS)} may be allowed"
        )
    skew = _number(MCP_CLOCK_SKEW_ENV, "seconds", 0, MAX_MCP_CLOCK_SKEW)
    policy = _env(MCP_POLICY_ENV)
    idle = _number(MCP_SESSION_IDLE_ENV, "seconds", 1, 7 * 86400)
    sessions_text = _env(MCP_MAX_SESSIONS_ENV)
    try:
        sessions = int(sessions_text) if sessions_text else Settings.mcp_max_sessions
    except ValueError:
        raise SettingsError(f"{MCP_MAX_SESSIONS_ENV}={sessions_text!r} is not a whole number of sessions") from None
    return {
        "mcp_oauth_issuer": _env(MCP_OAUTH_ISSUER_ENV),
        "mcp_resource": _env(MCP_RESOURCE_ENV),
        "mcp_jwks_uri": _env(MCP_JWKS_URI_ENV),
        "mcp_introspection_client": _env(MCP_INTROSPECTION_CLIENT_ENV),
        "mcp_introspection_secret": _env(MCP_INTROSPECTION_SECRET_ENV),
        "mcp_token_algorithms": algorithms or MCP_TOKEN_ALGORITHMS,
        "mcp_clock_skew": MCP_CLOCK_SKEW if skew is None else skew,
        "mcp_policy": Path(policy) if policy else None,
        "mcp_rate_limit": _number(MCP_RATE_LIMIT_ENV, "calls per second", 0.001, 1_000_000),
        "mcp_audit_topic": _flag(MCP_AUDIT_TOPIC_ENV),
        "mcp_audit_arguments": _flag(MCP_AUDIT_ARGUMENTS_ENV),
        "mcp_audit_key": Path(key) if (key := _env(MCP_AUDIT_KEY_ENV)) else None,
        "mcp_session_idle": Settings.mcp_session_idle if idle is None else idle,
        "mcp_max_sessions": sessions,
        "mcp_max_message": _whole(MCP_MAX_MESSAGE_ENV, " of bytes"),
    }


class _Admin(TypedDict):
    admin_url: str | None
    admin_token: str | None
    cluster: str | None
    audit_retention: str | None


def _admin_env() -> _Admin:
    """What `toolreg init` (and deploy/pulsar-init.sh, under the same names) reads to reach the admin API."""
    token = None
    path = _env(ADMIN_TOKEN_FILE_ENV)
    if path is not None:
        try:
            token = Path(path).read_text().strip() or None
        except OSError as exc:
            raise SettingsError(
                f"cannot read {ADMIN_TOKEN_FILE_ENV} {path!r}: {exc.strerror}; fix the path or unset it"
            ) from None
    return {
        "admin_url": _env(ADMIN_URL_ENV),
        "admin_token": token,
        "cluster": _env(CLUSTER_ENV),
        "audit_retention": _env(AUDIT_RETENTION_ENV),
    }


# --- read when needed: logging, the event loop -------------------------------------------

LOG_LEVEL_ENV = "TOOLREG_LOG_LEVEL"
LOG_FORMAT_ENV = "TOOLREG_LOG_FORMAT"
NO_COLOR_ENV = "NO_COLOR"


def log_level() -> str | None:
    """`TOOLREG_LOG_LEVEL`: `debug`, `info`, `warning` or `error`, as given; None when unset or empty (info)."""
    return os.environ.get(LOG_LEVEL_ENV) or None


def log_format() -> str:
    """`TOOLREG_LOG_FORMAT`, lower-cased: `json` or `console`; "" when unset (then the stream decides: JSON off a
    terminal)."""
    return os.environ.get(LOG_FORMAT_ENV, "").lower()


def no_color() -> bool:
    """`NO_COLOR` set to anything but the empty string (no-color.org): console logs without colours, even on a
    terminal."""
    return bool(os.environ.get(NO_COLOR_ENV))


EVENT_LOOP_ENV = "TOOLREG_EVENT_LOOP"
EVENT_LOOPS = ("uvloop", "asyncio")


def event_loop() -> str:
    """`TOOLREG_EVENT_LOOP`: `uvloop` or `asyncio`; unset, uvloop where it is installed (`tool-discovery[uvloop]`), else
    asyncio.

    Raises `ToolDiscoveryError` for another value, or for `uvloop` when it is not installed.
    """
    chosen = (_env(EVENT_LOOP_ENV) or "").lower()
    if chosen and chosen not in EVENT_LOOPS:
        raise ToolDiscoveryError(f"{EVENT_LOOP_ENV}={chosen!r}: use uvloop or asyncio")
    installed = importlib.util.find_spec("uvloop") is not None
    if chosen == "uvloop" and not installed:
        raise ToolDiscoveryError(
            f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed: pip install 'tool-discovery[uvloop]'"
        )
    return chosen or ("uvloop" if installed else "asyncio")

"""The product's one error tree.

Every error a caller of `toolservice_base`, `discovery` or `agent_bridge` can
meet derives from `ToolDiscoveryError`, so an agent can catch the product's
failures with one clause and tell them apart by type, never by message text.
Broker exceptions are translated where they arise (`transport.pulsar`) and
never cross a public API.

Messages are one line that says what went wrong and what to do.
"""

from __future__ import annotations


class ToolDiscoveryError(Exception):
    """Root of every error the product raises on purpose."""


# --- the broker ------------------------------------------------------------------


class TransportError(ToolDiscoveryError):
    """The broker could not be reached or refused an operation.

    `retriable` says whether the same call may succeed later unchanged (a lost
    connection, a timeout) or never will (a bad token, a message too large).
    """

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


class BrokerUnreachable(TransportError):
    """No connection to the broker (down, wrong URL, network)."""


class AuthenticationFailed(TransportError):
    """The broker refused us: our credentials (a missing, wrong or expired token), or what our role may do.

    Not retriable: the same call fails the same way until someone acts (a new
    token, a grant). A running consumer or producer keeps reconnecting on its
    own meanwhile, so the grant or the new token heals it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class TokenExpired(AuthenticationFailed):
    """Our token's `exp` has passed and the broker refuses it now; `expired_at` is when (seconds since the epoch)."""

    def __init__(self, message: str, *, expired_at: float) -> None:
        super().__init__(message)
        self.expired_at = expired_at


class NotAuthorized(AuthenticationFailed):
    """The broker took our token, but its role may not use `namespace`: a permission never granted, or revoked.

    Apache Pulsar tells a role that is not a superuser the same about a
    namespace that does not exist, so the message names both fixes. `role` is
    the one the token names (None if it names none).
    """

    def __init__(self, message: str, *, namespace: str, role: str | None) -> None:
        super().__init__(message)
        self.namespace = namespace
        self.role = role


class NamespaceMissing(TransportError):
    """A namespace the product uses does not exist (never created, or deleted); `namespace` names it. Not retriable."""

    def __init__(self, message: str, *, namespace: str) -> None:
        super().__init__(message, retriable=False)
        self.namespace = namespace


class MessageTooLarge(TransportError):
    """A message is over the broker's size limit; sending it again cannot help."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class TransportClosed(TransportError):
    """The transport, producer or consumer was already closed."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class RequestTimeout(TransportError, TimeoutError):
    """No (further) response arrived in time.

    `received` is how many responses had come when it was given up: 0 when
    none did (nobody answered), more when a streamed answer was still coming
    at the call's deadline (the service works, it is not gone), so a caller
    can tell the two apart without reading the message.
    """

    def __init__(self, message: str, *, received: int = 0) -> None:
        super().__init__(message)
        self.received = received


class ProducerBusy(TransportError):
    """Another producer holds the topic exclusively; try again later, or wait for it (mode `wait`).

    Retriable: the holder goes away sooner or later (closed, dead, or fenced by a takeover).
    """


class Fenced(TransportError):
    """A newer exclusive producer took the topic over: this producer may never write there again.

    Not retriable by design: a replica that sees it has been deposed steps down, so the
    deposed one and its successor never both write (split brain).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class BrokerUnsupported(TransportError):
    """The broker lacks a feature the operation needs (pulsar-lite has no exclusive producers); asking again cannot
    help."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class SettingsError(ToolDiscoveryError):
    """An environment variable holds a value the product cannot use; the message names it and what it takes."""


class NoBrokerError(ToolDiscoveryError):
    """No broker is configured and none is running under the data directory."""


# --- the config store --------------------------------------------------------------


class ConfigError(ToolDiscoveryError):
    """The config store refused a request, or answered nonsense; the message says why.

    `code` is the store's error type on the wire (`bad-request`, `invalid`, ...).
    """

    code = "error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ConfigConflict(ConfigError):
    """A conditional write found the store in another state; nothing was written."""

    code = "conflict"


class ConfigRefused(ConfigError):
    """The store refused a value (validation or a limit); nothing was written."""

    code = "invalid"


class ChangesUnavailable(ConfigError):
    """The store cannot say what changed since a version: it is past the store's change feed (`too-old`), or the
    store has none (`bad-operation`: TrustGraph's, or an older release). Read everything instead."""

    code = "too-old"


# --- tool services and calls ---------------------------------------------------------


class ServiceDefinitionError(ToolDiscoveryError, ValueError):
    """The class attributes of a `DynamicToolService` subclass are not a valid service."""


class McpServerError(ToolDiscoveryError):
    """An MCP server brought into the fleet (`McpToolService`, `toolreg announce --mcp`) could not be reached, did
    not answer as MCP says, or offers tools that cannot be announced as they are. The message names which, and what
    to do."""


class BadRequest(ToolDiscoveryError, ValueError):
    """A request that cannot be parsed; answered with an error, never a crash."""


class BadQuery(ToolDiscoveryError, ValueError):
    """A tool search that cannot be answered as asked (no words in it, too long, a limit out of range); the message
    says what would be."""


class ToolError(ToolDiscoveryError):
    """A tool call failed: the service answered with an error, or could not be asked.

    `type` and `message` are the service's own (`ExpressionError`, `division by
    zero`), so an agent can show the LLM exactly what went wrong.
    """

    def __init__(self, type: str, message: str, *, service: str = "") -> None:
        where = f" (tool service {service!r})" if service else ""
        super().__init__(f"{type}: {message}{where}")
        self.type = type
        self.message = message
        self.service = service


class BadArguments(ToolError, ValueError):
    """Arguments that break the tool's advertised JSON Schema; refused before anything is sent.

    A `ToolError` (type `bad-arguments`), so an agent that shows tool errors
    to its LLM shows this one too, and the model can correct its call.
    `argument` names the offending argument.
    """

    def __init__(self, tool: str, argument: str, message: str, *, service: str = "") -> None:
        super().__init__("bad-arguments", f"tool {tool!r}: {message}", service=service)
        self.tool = tool
        self.argument = argument


class AnswerTooLarge(ToolError):
    """A tool's answer grew past the caller's `max_answer_bytes`; the call was stopped (type `answer-too-large`)."""

    def __init__(self, limit: int, *, tool: str = "", service: str = "") -> None:
        which = f"tool {tool!r}" if tool else "the tool"
        super().__init__(
            "answer-too-large",
            f"the answer of {which} passed {limit} bytes (max_answer_bytes); ask it for less, or raise the limit",
            service=service,
        )
        self.limit = limit


class UnknownToolError(ToolDiscoveryError, LookupError):
    """`invoke` named a tool the set does not hold."""


class BridgeUnavailable(ToolDiscoveryError):
    """Neither the config store nor a fallback could give the ToolSet its tools."""


__all__ = [
    "AnswerTooLarge",
    "AuthenticationFailed",
    "BadArguments",
    "BadRequest",
    "BridgeUnavailable",
    "BrokerUnreachable",
    "BrokerUnsupported",
    "ChangesUnavailable",
    "ConfigConflict",
    "ConfigError",
    "ConfigRefused",
    "Fenced",
    "McpServerError",
    "MessageTooLarge",
    "NamespaceMissing",
    "NoBrokerError",
    "NotAuthorized",
    "ProducerBusy",
    "RequestTimeout",
    "ServiceDefinitionError",
    "SettingsError",
    "TokenExpired",
    "ToolDiscoveryError",
    "ToolError",
    "TransportClosed",
    "TransportError",
    "UnknownToolError",
]

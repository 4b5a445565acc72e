"""The floor of tool discovery: wire schemas, the transport seam, the embedded
broker, logging, the config-store client and `DynamicToolService`."""

from . import topics
from .announcer import Announcer
from .broker import EmbeddedBroker
from .configclient import ConfigClient, watch_config
from .errors import (
    AnswerTooLarge,
    AuthenticationFailed,
    BadArguments,
    BadRequest,
    BrokerError,
    BrokerUnreachable,
    ConfigConflict,
    ConfigError,
    ConfigRefused,
    MessageTooLarge,
    NoBrokerError,
    RequestTimeout,
    ServiceDefinitionError,
    ToolDiscoveryError,
    ToolError,
    TransportClosed,
    TransportError,
    UnknownToolError,
)
from .logs import configure_logging
from .rpc import RequestClient, RequestServer
from .schemas import (
    Announcement,
    Argument,
    ConfigParam,
    ConfigPush,
    Error,
    ToolDescriptor,
    ToolServiceDescriptor,
    ToolServiceRequest,
    ToolServiceResponse,
    canonical_json,
    descriptor_digest,
)
from .service import DynamicToolService
from .settings import Settings
from .topics import Topics
from .transport import (
    Capabilities,
    Envelope,
    MemoryBroker,
    Publisher,
    Subscription,
    Transport,
    open_transport,
)

__all__ = [
    "AnswerTooLarge",
    "BadArguments",
    "Announcement",
    "Announcer",
    "Argument",
    "AuthenticationFailed",
    "BadRequest",
    "BrokerError",
    "BrokerUnreachable",
    "Capabilities",
    "ConfigClient",
    "ConfigConflict",
    "ConfigError",
    "ConfigParam",
    "ConfigPush",
    "ConfigRefused",
    "DynamicToolService",
    "EmbeddedBroker",
    "Envelope",
    "Error",
    "MemoryBroker",
    "MessageTooLarge",
    "NoBrokerError",
    "Publisher",
    "RequestClient",
    "RequestServer",
    "RequestTimeout",
    "ServiceDefinitionError",
    "Settings",
    "Subscription",
    "ToolDiscoveryError",
    "ToolError",
    "Topics",
    "Transport",
    "TransportClosed",
    "TransportError",
    "UnknownToolError",
    "open_transport",
    "ToolDescriptor",
    "ToolServiceDescriptor",
    "ToolServiceRequest",
    "ToolServiceResponse",
    "canonical_json",
    "configure_logging",
    "descriptor_digest",
    "topics",
    "watch_config",
]

"""The floor of tool discovery: wire schemas, the Pulsar layer, the embedded
broker, logging, the config-store client and `DynamicToolService`."""

from . import topics
from .announcer import Announcer
from .broker import BrokerError, EmbeddedBroker
from .configclient import ConfigClient, ConfigConflict, ConfigError, watch_config
from .logs import configure_logging
from .messaging import PULSAR_ERRORS, Connection, Publisher, Subscription
from .rpc import RequestClient, RequestServer, RequestTimeout
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
from .service import DynamicToolService, ServiceDefinitionError
from .settings import NoBrokerError, Settings

__all__ = [
    "Announcement",
    "Announcer",
    "Argument",
    "BrokerError",
    "ConfigClient",
    "ConfigConflict",
    "ConfigError",
    "ConfigParam",
    "ConfigPush",
    "Connection",
    "DynamicToolService",
    "EmbeddedBroker",
    "Error",
    "NoBrokerError",
    "PULSAR_ERRORS",
    "Publisher",
    "RequestClient",
    "RequestServer",
    "RequestTimeout",
    "ServiceDefinitionError",
    "Settings",
    "Subscription",
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

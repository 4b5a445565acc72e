"""The well-known topics of the product.

Every topic is non-persistent: requests, responses, pushes and announcements
are soft state (a lost one is retried, refetched or re-announced), and the
durable truth lives in the config store's SQLite file.
"""

from __future__ import annotations

CONFIG_REQUEST = "non-persistent://tg/request/config"
CONFIG_RESPONSE = "non-persistent://tg/response/config"
CONFIG_NOTIFY = "non-persistent://tg/notify/config"

TOOL_DESCRIPTORS = "non-persistent://tg/discovery/tool-descriptors"
TOOL_PROBE = "non-persistent://tg/discovery/tool-probe"

REGISTRY_REQUEST = "non-persistent://tg/request/tool-registry"
REGISTRY_RESPONSE = "non-persistent://tg/response/tool-registry"


def default_request_queue(service_id: str) -> str:
    return f"non-persistent://tg/request/{service_id}"


def default_response_queue(service_id: str) -> str:
    return f"non-persistent://tg/response/{service_id}"

"""What the registry says of each tool, for the agent's search: `toolreg mcp --search` and `toolreg tools --search`.

The registry's query API `list` gives each tool's status (held and unavailable tools are never returned by a
search) and, where the services' heartbeats carry counters, its calls/s and errors/s over every caller (their
ratio ranks a failing tool lower). `toolreg mcp --search` asks every `REPORT_INTERVAL` seconds; when the
registry stops answering, its last report is dropped after `STALE_AFTER` seconds (a status that old may be
wrong, and the agent's own calls still count), and taken up again when it answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from agent_bridge import ToolSet
from discovery.errors import RegistryUnavailable
from discovery.registry.client import RegistryClient
from discovery.registry.protocol import ToolStatus
from discovery.registry.search import usage_health
from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.logs import get_logger
from toolservice_base.search import Health

log = get_logger("discovery.search")

REPORT_INTERVAL = 5.0
STALE_AFTER = 30.0


def reports(tools: Iterable[ToolStatus]) -> dict[str, Health]:
    """The registry's listing as the health a search ranks by."""
    return {tool.name: usage_health(tool.status, tool.usage) for tool in tools}


async def follow_registry(
    tools: ToolSet, client: RegistryClient, interval: float = REPORT_INTERVAL, stale_after: float = STALE_AFTER
) -> None:
    """Feed `tools.report_health` from the registry until cancelled."""
    heard = time.monotonic()
    silent = False
    while True:
        try:
            listing = await client.list(tools.workspace)
        except (RegistryUnavailable, ToolDiscoveryError) as exc:
            if not silent and time.monotonic() - heard > stale_after:
                silent = True
                tools.report_health({})
                log.warning("search.registry_silent", error=str(exc).splitlines()[0], dropped="its last report")
        else:
            heard = time.monotonic()
            if silent:
                silent = False
                log.info("search.registry_answers")
            tools.report_health(reports(listing.tools))
        await asyncio.sleep(interval)

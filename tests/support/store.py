"""What a test asks of the config store while it waits for the registry: which tools are there, and as what.

Each is one read, meant for `eventually(lambda: has_tools(client, "x"))`: the registry writes on its own schedule.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from discovery.registry.service import Registry
    from toolservice_base import ConfigClient


async def tool_names(client: ConfigClient, workspace: str = "default") -> set[str]:
    """The names of the `tool` items in `workspace`."""
    return set(await client.list("tool", workspace=workspace))


async def tools_in_store(client: ConfigClient, workspace: str = "default") -> dict[str, dict[str, Any]]:
    """Every `tool` item of `workspace`, parsed."""
    return {name: json.loads(value) for name, value in (await client.getvalues("tool", workspace=workspace)).items()}


async def has_tools(client: ConfigClient, *names: str, workspace: str = "default") -> bool:
    """All of `names` are `tool` items of `workspace` (others may be there too)."""
    return set(names) <= await tool_names(client, workspace)


async def lacks_tools(client: ConfigClient, *names: str, workspace: str = "default") -> bool:
    """None of `names` is a `tool` item of `workspace`."""
    return not set(names) & await tool_names(client, workspace)


async def registry_lists(registry: Registry, name: str) -> bool:
    """The registry's own listing (what `toolreg tools` shows) holds a tool called `name`."""
    return any(tool.name == name for tool in await registry.list_tools())

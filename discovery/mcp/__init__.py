"""The MCP front: a workspace's live `ToolSet` served over MCP (`server`), on stdio or streamable HTTP
(`transports`), configured by `settings`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from discovery.lazy import lazy_exports

if TYPE_CHECKING:
    from discovery.mcp.server import McpFront

# Loaded on first use: the registry reads the front's settings (`settings`) without loading the MCP SDK.
__getattr__ = lazy_exports(__name__, {"McpFront": "discovery.mcp.server"})

__all__ = ["McpFront"]

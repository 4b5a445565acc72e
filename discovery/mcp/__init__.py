"""The MCP front: a workspace's live `ToolSet` served over MCP (`server`), on stdio or streamable HTTP
(`transports`)."""

from discovery.mcp.server import McpFront

__all__ = ["McpFront"]

"""Bring an MCP server into the fleet: `McpToolService` announces its tools as one tool service and answers their
calls by calling it (`toolreg announce --mcp` is its command).

    from toolservice_base.mcp_service import McpCommand, McpToolService, McpUrl

This package is the only part of `toolservice_base` that imports the MCP SDK (the client); importing
`toolservice_base` itself does not load it.
"""

from .listing import Selection, service_id_of, tool_name
from .service import McpToolService
from .upstream import McpCommand, McpServer, McpUrl

__all__ = ["McpCommand", "McpServer", "McpToolService", "McpUrl", "Selection", "service_id_of", "tool_name"]

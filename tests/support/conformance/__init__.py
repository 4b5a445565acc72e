"""The MCP conformance suite's tools, served two ways through `toolreg mcp`: `service` (a `DynamicToolService`)
and `sdk_server` (an MCP server on the official SDK, run as its own process) brought onto the bus by
`toolreg announce --mcp`."""

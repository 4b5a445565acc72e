"""`toolreg mcp --search`: two tools in front of thousands, so a client's context holds two definitions.

- `search_tools(query, limit)` answers with the definitions of the live tools that best match, as `tools/list`
  would give them (name, title, description, input and output schemas, annotations), each with its score, ranked
  by `ToolSet.search`: by text, then by health (a held or unavailable tool is never offered; one failing most
  of its calls comes after a healthy one that matches as well).
- `call_tool(name, arguments)` calls any live tool by the name `search_tools` gave, and answers with that tool's
  own result: its content blocks, structured content, or error.

A live tool can also be called directly by its name with `tools/call`, as a client that adds what it found to its
own list would. The surface never changes, so no `list_changed` is sent; the tools behind it follow the
`ToolSet` as ever. Precedents: Anthropic's tool search tool, docker mcp-gateway's `mcp-find`, SEP-1821.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from agent_bridge import BadQuery, ToolSet
from toolservice_base.search import MAX_LIMIT, MAX_QUERY_CHARS, check_limit

SEARCH = "search_tools"
CALL = "call_tool"
DEFAULT_LIMIT = 5

SEARCH_TOOL = types.Tool(
    name=SEARCH,
    title="Search the live tools",
    description=(
        "Find the tools for a task among every live tool, best first: describe what you want to do in a few words "
        f"(e.g. 'create a ticket in jira'). Returns each match's name, description and input schema; call one with "
        f"{CALL}."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "What the tool should do, in words",
                "minLength": 1,
                "maxLength": MAX_QUERY_CHARS,
            },
            "limit": {
                "type": "integer",
                "description": f"Most tools to return (1 to {MAX_LIMIT}, default {DEFAULT_LIMIT})",
                "minimum": 1,
                "maximum": MAX_LIMIT,
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "tools": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "title": {"type": "string"},
                        "description": {"type": "string"},
                        "inputSchema": {"type": "object"},
                        "outputSchema": {"type": "object"},
                        "annotations": {"type": "object"},
                        "score": {"type": "number"},
                    },
                    "required": ["name", "description", "inputSchema", "score"],
                },
            }
        },
        "required": ["tools"],
    },
    annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
)
CALL_TOOL = types.Tool(
    name=CALL,
    title="Call a live tool",
    description=f"Call a tool {SEARCH} found, by its name, with arguments that fit its input schema.",
    input_schema={
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": f"The tool's name, as {SEARCH} gave it"},
            "arguments": {"type": "object", "description": "The tool's arguments, per its input schema"},
        },
        "required": ["name"],
        "additionalProperties": False,
    },
)
SURFACE = [SEARCH_TOOL, CALL_TOOL]


async def search_result(
    tools: ToolSet, listed: dict[str, types.Tool], mcp_name: dict[str, str], args: dict[str, Any]
) -> types.CallToolResult:
    """`search_tools`: the best live tools `listed` (MCP name -> tool, filters applied) holds for the query."""
    query, limit = args.get("query"), args.get("limit", DEFAULT_LIMIT)
    if not isinstance(query, str):
        return refusal("query must be text: what the tool should do, in words")
    try:
        check_limit(limit)
        # Asked for more than `limit` when --tools/--exclude leave some out: they are dropped after ranking.
        matches = await tools.search(query, limit if len(listed) >= len(tools) else MAX_LIMIT)
    except BadQuery as exc:
        return refusal(str(exc))
    found = []
    for match in matches:
        tool = listed.get(mcp_name.get(match.name, ""))
        if tool is not None:
            definition = tool.model_dump(by_alias=True, mode="json", exclude_none=True, exclude={"meta"})
            found.append({**definition, "score": round(match.score, 4)})
    found = found[:limit]
    text = json.dumps(found, ensure_ascii=False) if found else f"no live tool matches {query!r}; try other words"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content={"tools": found}
    )


def refusal(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)

"""The agent side of tool discovery: call tool services, and keep a live, hot-reloading set of them.

    from agent_bridge import ToolSet

    async with ToolSet(workspace="default") as tools:
        print(tools.as_openai_tools())
        print(await tools.invoke("tell-joke", {"topic": "cats"}))

`ToolSet` reads `tool` + `tool-service` items from the config store, builds one
implementation per tool through a factory keyed by the tool's `type`
(`tool-service` built in; `register_tool_type` for others), follows every
change without a restart, and falls back to its last snapshot or a directory
of static JSON files when the store does not answer at start.

How a call is routed: `ToolSet.invoke(name, arguments)` looks the name up in
the set of the moment (`reload`: one immutable state, swapped whole), checks
the arguments against the tool's JSON Schema (`arguments`), and calls the
tool its factory built (`impls`). For a `tool-service` tool that is a
`ToolServiceImpl`, holding the one `ToolServiceClient` (`client`) shared by
every tool of its service: the request goes out on the service's request
queue with the tool's config values, any instance of the service takes it,
and the answer (streamed or whole) comes back on the caller's private reply
queue, matched by its `id` (`toolservice_base.rpc`). The call's bounds
travel with it as one `CallLimits` (`limits`); past one, the service is told
to stop. The framework adapters (`integrations`) and `toolreg mcp` call
through `ToolSet.invoke` or `ToolSet.stream`, the same way.
"""

from toolservice_base.errors import (
    AnswerTooLarge,
    BadArguments,
    BadQuery,
    BridgeUnavailable,
    RequestTimeout,
    ToolDiscoveryError,
    ToolError,
    UnknownToolError,
)
from toolservice_base.rpc import CallLimits
from toolservice_base.schemas import ToolResult

from .client import ToolServiceClient
from .impls import (
    Tool,
    ToolContext,
    ToolFactory,
    ToolServiceImpl,
    arguments_schema,
    register_tool_type,
)
from .static import StaticDirError, load_static_dir
from .toolset import ToolSet

__all__ = [
    "AnswerTooLarge",
    "BadArguments",
    "BadQuery",
    "BridgeUnavailable",
    "CallLimits",
    "RequestTimeout",
    "StaticDirError",
    "Tool",
    "ToolContext",
    "ToolDiscoveryError",
    "ToolError",
    "ToolFactory",
    "ToolServiceClient",
    "ToolServiceImpl",
    "ToolResult",
    "ToolSet",
    "UnknownToolError",
    "arguments_schema",
    "load_static_dir",
    "register_tool_type",
]

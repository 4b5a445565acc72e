"""The live `ToolSet` in the agent frameworks people write agents with.

One module per framework, each an optional extra of the same name:

- `agent_bridge.integrations.pydantic_ai.LiveToolset(toolset)`: a pydantic-ai
  toolset whose tools are the ToolSet's current ones at every step of every run
  (`pip install 'tool-discovery[pydantic-ai]'`).
- `agent_bridge.integrations.langchain.as_langchain_tools(toolset)`:
  LangChain `StructuredTool`s; `live_tools_middleware(toolset)` keeps a
  `create_agent` agent's tools current at every model call
  (`pip install 'tool-discovery[langchain]'`).
- `agent_bridge.integrations.openai_agents.as_function_tools(toolset)`:
  `FunctionTool`s for the OpenAI Agents SDK (`pip install 'tool-discovery[openai-agents]'`).

Every call goes through `ToolSet.invoke` (or `ToolSet.stream`), so arguments
are checked against the advertised schema, metrics and traces are kept, and
names are the OpenAI-safe ones of `ToolSet.as_openai_tools()`. A tool's error
goes back to the model the framework's way; it never ends the run.

This package imports no framework: each module imports its own when it is
imported, and says which extra to install if it is missing.
"""

"""Tool names as LLM function-calling APIs accept them.

Our tool names may hold dots and run to 128 characters (`NAME_PATTERN`), so
that services can namespace them (`acme.search.v2`). OpenAI's function names
may not: `^[a-zA-Z0-9_-]{1,64}$`, and a request carrying one such name is
refused whole. `as_openai_tools()` therefore gives each tool a name the API
takes, and `ToolSet.invoke` accepts that name back, so an agent can pass the
model's tool call straight through.

The mapping lives in `toolservice_base.names`, because the registry must
work out the same names (it refuses a tool whose client-visible name another
tool already has); this module keeps its public names.
"""

from __future__ import annotations

from toolservice_base.names import OPENAI_NAME, client_name, openai_names

__all__ = ["OPENAI_NAME", "client_name", "openai_names"]

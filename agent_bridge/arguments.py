"""A call's arguments, checked against the JSON Schema the tool advertises, before anything is sent.

The schema is `arguments_schema(tool)`, the very one `as_openai_tools()`,
`as_mcp_tools()` and `describe()` hand to the model, and the check is the
`jsonschema` library's, so what the model is told and what the ToolSet
accepts cannot drift apart. A refusal is one line naming the argument (for a
tool with a full input schema, the JSON path of the first violation, as the
service itself would say: `toolservice_base.tool_contract`), so an agent can
hand it back to the model to correct its call; the values it quotes are
spelled as the JSON the model wrote (`null`, `true`, `false`), not as the
library's Python reprs.

Both kinds of schema are checked as `toolservice_base.tool_contract.SchemaCheck`
checks them: a compiled validator says "valid" in a fraction of a microsecond,
and anything it does not accept goes to the library, which has the last word
and the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema.exceptions import best_match

from toolservice_base.errors import BadArguments
from toolservice_base.schemas import ToolDescriptor, json_literals
from toolservice_base.tool_contract import SchemaCheck, ToolContract

from .impls import arguments_schema

MAX_DETAIL = 200
"""Characters of the library's own message kept in a refusal (it quotes the value, which may be long)."""


class ArgumentCheck:
    """The compiled schema of one tool; built once per tool and reused by every call."""

    __slots__ = ("tool", "service", "schema", "_check", "_contract")

    def __init__(self, tool: ToolDescriptor) -> None:
        self.tool = tool.name
        self.service = tool.service or ""
        self.schema = arguments_schema(tool)
        self._contract = ToolContract(tool) if tool.input_schema is not None else None
        self._check = self._contract.arguments if self._contract is not None else SchemaCheck(self.schema)

    def check(self, arguments: Mapping[str, Any]) -> None:
        """Return if `arguments` fit the schema; else raise `BadArguments` naming the first argument at fault."""
        if self._contract is not None:
            self._contract.check_arguments(arguments)
            return
        if self._check.is_valid(arguments):
            return
        raise self._refusal(arguments)

    def _refusal(self, arguments: Mapping[str, Any]) -> BadArguments:
        properties: dict[str, Any] = self.schema["properties"]
        missing = [name for name in self.schema["required"] if name not in arguments]
        if missing:
            also = f"; so are {', '.join(repr(m) for m in missing[1:])}" if len(missing) > 1 else ""
            kind = properties[missing[0]]["type"]
            return self._bad(missing[0], f"argument {missing[0]!r} is missing (required, {kind}){also}")
        unknown = [name for name in arguments if name not in properties]
        if unknown:
            takes = ", ".join(properties) or "no arguments"
            return self._bad(unknown[0], f"unknown argument {unknown[0]!r}; {self.tool} takes {takes}")
        error = best_match(self._check.validator.iter_errors(arguments))
        if error is None:  # pragma: no cover - is_valid said there was one
            return self._bad("", "arguments do not match the tool's schema")
        argument = str(error.absolute_path[0]) if error.absolute_path else ""
        message = json_literals(error.message)
        detail = message if len(message) <= MAX_DETAIL else message[: MAX_DETAIL - 3] + "..."
        return self._bad(argument, f"argument {argument!r}: {detail}" if argument else detail)

    def _bad(self, argument: str, message: str) -> BadArguments:
        return BadArguments(self.tool, argument, " ".join(message.split()), service=self.service)

"""Which of a service's tools a request is for, as a bounded label for its metrics and spans.

The tool-service protocol does not name the tool: a service serving several
tools tells them apart by the config values each tool sends. Our bridge names
the tool in the request's `tool` message property; other callers (a stock
TrustGraph agent) do not, so they are matched on their config values. The
answer is always one of the service's declared tool names or `(other)`: the
property is the caller's word, and must not be able to create series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from toolservice_base.rpc.wire import TOOL

from .metrics import OTHER_TOOL
from .schemas import ToolDescriptor, canonical_json


class ToolLabels:
    """The label of each request for one service's declared tools."""

    def __init__(self, tools: Iterable[ToolDescriptor]) -> None:
        tools = list(tools)
        self.names = frozenset(tool.name for tool in tools)
        by_config: dict[str, list[str]] = {}
        for tool in tools:
            by_config.setdefault(canonical_json(tool.config_values), []).append(tool.name)
        self._by_config = {config: names[0] for config, names in by_config.items() if len(names) == 1}
        """Config values no other tool of the service shares -> that tool."""

    def of(self, properties: Mapping[str, str], config: dict[str, Any] | None = None) -> str:
        """The tool named in `properties` if the service declares it; else the only tool; else the one `config` matches;
        else `(other)`."""
        named = properties.get(TOOL)
        if named is not None:
            return named if named in self.names else OTHER_TOOL
        if len(self.names) == 1:
            return next(iter(self.names))
        if config is not None:
            return self._by_config.get(canonical_json(config), OTHER_TOOL)
        return OTHER_TOOL

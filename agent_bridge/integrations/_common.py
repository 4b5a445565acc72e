"""What the framework adapters share: importing a framework, the current specs, errors for the model."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolservice_base.errors import BadArguments, RequestTimeout, ToolDiscoveryError, ToolError, UnknownToolError

if TYPE_CHECKING:
    from .. import ToolSet


def require(module: str, extra: str, distribution: str) -> ModuleType:
    """Import a framework's `module`, or fail with one line naming the extra that installs it.

    Only a missing framework is reworded: an ImportError from inside an
    installed framework (a broken dependency of its own) is raised as it is.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.partition(".")[0]
        if exc.name is None or exc.name.partition(".")[0] != top:
            raise
        raise ModuleNotFoundError(
            f"agent_bridge.integrations needs {distribution} for this: pip install 'tool-discovery[{extra}]'",
            name=exc.name,
        ) from None


@dataclass(frozen=True)
class Spec:
    """One tool as a model is told of it: the OpenAI-safe name `ToolSet.invoke` takes back, and its JSON Schema;
    and what MCP says of it besides, for a framework with a place for it: `title`, `annotations` (MCP's hints,
    camelCase), `output_schema`."""

    name: str
    description: str
    parameters: dict[str, Any]
    title: str | None = None
    annotations: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None

    def mcp_metadata(self) -> dict[str, Any] | None:
        """`title` and `annotations`, those it has, as a framework's free-form tool metadata; None if neither."""
        found = {key: value for key, value in (("title", self.title), ("annotations", self.annotations)) if value}
        return found or None


class SpecCache:
    """The ToolSet's current specs, rebuilt only when its set changed (version, source or names)."""

    __slots__ = ("toolset", "_key", "_specs")

    def __init__(self, toolset: ToolSet) -> None:
        self.toolset = toolset
        self._key: tuple[int, str, tuple[str, ...]] | None = None
        self._specs: tuple[Spec, ...] = ()

    def key(self) -> tuple[int, str, tuple[str, ...]]:
        toolset = self.toolset
        return (toolset.version, toolset.source, tuple(toolset.names()))

    def current(self) -> tuple[Spec, ...]:
        key = self.key()
        if key != self._key:
            described = self.toolset.describe()  # in the same order as as_openai_tools(), which names them
            self._specs = tuple(
                Spec(
                    f["name"],
                    f["description"],
                    f["parameters"],
                    spec.get("title"),
                    spec.get("annotations"),
                    spec.get("output_schema"),
                )
                for f, spec in zip((t["function"] for t in self.toolset.as_openai_tools()), described)
            )
            self._key = key
        return self._specs


def is_retry(exc: BaseException) -> bool:
    """Whether the model should correct its call (bad arguments, a tool it may not call now) rather than be told of a
    failure."""
    return isinstance(exc, (BadArguments, UnknownToolError))


def for_model(name: str, exc: ToolDiscoveryError) -> str:
    """One line for the model: what went wrong with its call of tool `name`."""
    if isinstance(exc, ToolError | UnknownToolError):
        return str(exc)  # "bad-arguments: tool 'x': argument 'n' is missing ...", "timeout: ...", "no tool named ..."
    if isinstance(exc, RequestTimeout):
        return f"timeout: tool {name!r} did not answer in time"  # the queue names in `exc` are for operators
    return f"{type(exc).__name__}: tool {name!r} could not be called ({exc})"

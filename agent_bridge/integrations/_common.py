"""What the framework adapters share: importing a framework, the current specs, errors for the model."""

from __future__ import annotations

import asyncio
import base64
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolservice_base.errors import (
    BadArguments,
    BadQuery,
    RequestTimeout,
    ToolDiscoveryError,
    ToolError,
    UnknownToolError,
)
from toolservice_base.schemas.content import (
    AudioContent,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    TextContent,
    ToolResult,
    render,
)
from toolservice_base.search import MAX_QUERY_CHARS, query_terms

from ..specs import ToolSpec

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


class SpecCache:
    """The ToolSet's current specs, read again only when its set changed (version, source or names).

    A model is told of each tool by its `openai_name` (what `ToolSet.invoke` takes back); the set's own names are
    for looking specs up (`of`, after a search).
    """

    __slots__ = ("toolset", "_key", "_specs", "_own")

    def __init__(self, toolset: ToolSet) -> None:
        self.toolset = toolset
        self._key: tuple[int, str, tuple[str, ...]] | None = None
        self._specs: tuple[ToolSpec, ...] = ()
        self._own: dict[str, ToolSpec] = {}

    def key(self) -> tuple[int, str, tuple[str, ...]]:
        toolset = self.toolset
        return (toolset.version, toolset.source, tuple(toolset.names()))

    def current(self) -> tuple[ToolSpec, ...]:
        key = self.key()
        if key != self._key:
            self._specs = tuple(self.toolset.specs())
            self._own = {spec.name: spec for spec in self._specs}
            self._key = key
        return self._specs

    def of(self, names: list[str]) -> list[ToolSpec]:
        """The current specs of the tools the ToolSet calls `names` (its own names), in that order."""
        self.current()
        return [self._own[name] for name in names if name in self._own]


@dataclass(frozen=True)
class Binary:
    """One binary block of a result, as each framework's own form of it is built from: an image, audio, or a file
    (an embedded resource's blob), its bytes base64 as they came."""

    kind: str
    """"image", "audio" or "file"."""
    data: str
    mime_type: str
    name: str | None = None

    @property
    def bytes(self) -> bytes:
        return base64.b64decode(self.data)

    @property
    def data_url(self) -> str:
        return f"data:{self.mime_type};base64,{self.data}"


def model_parts(result: ToolResult) -> list[str | Binary] | None:
    """A result as text and binary parts for a framework that carries binary content to the model; None for one
    with only text (the adapter answers with `result.text`, as a text-only caller reads it).

    Without this, an image reached the model as its rendering (`[image: image/png, 71 bytes]`): the model was
    told an image exists and never shown it.
    """
    if all(isinstance(block, TextContent) for block in result.content):
        return None
    return [_part(block) for block in result.content]


def _part(block: ContentBlock) -> str | Binary:
    if isinstance(block, ImageContent):
        return Binary("image", block.data, block.mime_type)
    if isinstance(block, AudioContent):
        return Binary("audio", block.data, block.mime_type)
    if isinstance(block, EmbeddedResource) and block.resource.blob is not None:
        contents = block.resource
        name = contents.uri.rstrip("/").rpartition("/")[2] or None
        return Binary("file", contents.blob or "", contents.mime_type or "application/octet-stream", name)
    return render(block)  # text, a text resource, a resource link: the text the model reads


SEARCH_TOOL = "search_tools"
"""The tool a model is given in the top-k mode to look for other tools."""
SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "What the tool should do, in a few words"}},
    "required": ["query"],
    "additionalProperties": False,
}


class Focus:
    """The top-k mode of an adapter: the model is offered only the `top_k` tools that best match the step's query
    (`ToolSet.search`: by text, then by health), and `search_tools` to look for others.

    The query of a step is the model's own latest `search_tools` call, or else the conversation's last user
    message (its last `MAX_QUERY_CHARS` characters), whichever came last. A step with neither offers only
    `search_tools`.
    """

    def __init__(self, specs: SpecCache, top_k: int) -> None:
        if not 1 <= top_k <= 100:
            raise ValueError(f"top_k must be from 1 to 100, got {top_k}")
        self.specs = specs
        self.top_k = top_k
        self._memo: tuple[tuple[tuple[int, str, tuple[str, ...]], str], asyncio.Task[list[ToolSpec]]] | None = None

    @property
    def description(self) -> str:
        return (
            f"Find tools for a task among every live tool; the {self.top_k} best are offered to you at the next step."
            " Describe what you want to do in a few words."
        )

    async def offered(self, query: str | None) -> list[ToolSpec]:
        """The specs to offer for a step whose query is `query` (none: nothing but `search_tools`).

        One search per set and query: a framework that asks once per tool (the OpenAI Agents SDK's `is_enabled`)
        gets the answer of the first ask."""
        if not query:
            return []
        query = query[-MAX_QUERY_CHARS:]
        key = (self.specs.key(), query)
        memo = self._memo
        if memo is None or memo[0] != key or (memo[1].done() and (memo[1].cancelled() or memo[1].exception())):
            memo = self._memo = (key, asyncio.ensure_future(self._choose(query)))
        return await asyncio.shield(memo[1])  # one asker giving up does not stop the search the others wait for

    async def _choose(self, query: str) -> list[ToolSpec]:
        try:
            found = await self.specs.toolset.search(query, self.top_k)
        except BadQuery:
            found = []
        return self.specs.of([m.name for m in found])

    async def answer(self, query: Any) -> str:
        """What `search_tools` tells the model: the tools it will be offered, one a line, or why none."""
        if not isinstance(query, str):
            return "bad-arguments: search_tools takes a query, in words"
        try:
            query_terms(query[-MAX_QUERY_CHARS:])
        except BadQuery as exc:
            return str(exc)
        found = await self.offered(query)
        if not found:
            return f"no live tool matches {query!r}; try other words"
        return "Offered at your next step:\n" + "\n".join(f"- {spec.openai_name}: {spec.description}" for spec in found)


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

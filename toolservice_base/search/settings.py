"""What tool search embeds tools and queries with: read by every process that searches (a `ToolSet`, `toolreg mcp
--search`, `toolreg tools --search`, the registry page), so it lives beside the search, in the floor."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SettingsError
from ..variables import FromEnv, setting, text

DEFAULT_EMBEDDER = "wordllama"
WORDS_ONLY = "bm25"


def check_embedder(spec: str) -> str:
    """`spec` if it has the form of an embedder's name (`embedding`), else one line saying which forms do."""
    kind, _, rest = spec.partition(":")
    if spec in (DEFAULT_EMBEDDER, WORDS_ONLY) or (rest and (kind != "openai" or "@" in rest)):
        return spec
    raise SettingsError(
        f"{SearchSettings.env('embedder')}={spec!r} is not an embedder; use wordllama, bm25,"
        " sentence-transformers:<model>, fastembed:<model>, openai:<model>@<base-url> or <module>:<attribute>"
    )


@dataclass(frozen=True)
class SearchSettings(FromEnv):
    """The embedder search ranks by meaning with (`hybrid.ranker_for`), and its key."""

    embedder: str = setting(
        "TOOLREG_SEARCH_EMBEDDER",
        text,
        DEFAULT_EMBEDDER,
        "`wordllama` (shipped in its wheel, offline), `bm25` (words only), `sentence-transformers:<model>`,"
        " `fastembed:<model>`, `openai:<model>@<base-url>` or `<module>:<attribute>`",
    )
    embedder_key: str | None = setting(
        "TOOLREG_SEARCH_EMBEDDER_KEY", text, None, "the bearer token an `openai:` embeddings endpoint is sent"
    )

    def __post_init__(self) -> None:
        check_embedder(self.embedder)

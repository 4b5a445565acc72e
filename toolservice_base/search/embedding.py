"""`Embedder`: what turns tool text and queries into vectors, chosen by one setting, loaded once per process.

`TOOLREG_SEARCH_EMBEDDER` (`SearchSettings.embedder`) names it:

- `wordllama` (the default): WordLlama's `l2_supercat` static token embeddings, 256 dimensions, whose weights (16 MB)
  and tokenizer ship inside the `wordllama` wheel: nothing is downloaded, ever (the package's own loader would
  fetch the tokenizer from Hugging Face, so it is pointed at the package's own files with downloads off). A text's
  vector is the mean of its tokens' vectors: about 0.06 ms a query on one core, no GPU, no model server. Measured
  on `bench/meaning-corpus` (queries that share no word with their tool): recall@5 0.73 alone, against 0.04 for
  BM25. Cost (`python -m bench --only search`): about 140 MB installed (numpy, tokenizers and their
  dependencies), about 100 MB resident and 0.7 s to import and load, paid at the first search only.
- `bm25`: words only, no embedder (what every search did before).
- `sentence-transformers:<model>`, `fastembed:<model>`: a model of those libraries (installed by the deployment,
  which also decides where their weights come from).
- `openai:<model>@<base-url>`: an OpenAI-compatible `/embeddings` endpoint (`TOOLREG_SEARCH_EMBEDDER_KEY` is sent as
  its bearer token).
- `<module>:<attribute>`: an object of your own: a callable returning an `Embedder`.

Each embedder says what it is (`Embedder.name`), and an index records the name it was built with
(`HybridIndex.built_with`): an index made with another embedder than a build now would use is rebuilt whole, never
mixed (`hybrid.Rankers.stale`, checked by `LiveIndex` at each search). One that cannot be loaded (a package
missing, an endpoint down) is logged once, as one warning line, and search goes on by words alone (`load`); a
build `RETRY_AFTER` seconds later tries again, and the index is rebuilt with it once it loads.
"""

from __future__ import annotations

import importlib
import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..logs import get_logger
from .settings import DEFAULT_EMBEDDER as DEFAULT
from .settings import WORDS_ONLY

if TYPE_CHECKING:
    import numpy as np

log = get_logger("toolservice_base.search")

BATCH = 256
"""Texts embedded per call while an index is built: bounds a remote endpoint's request."""


@runtime_checkable
class Embedder(Protocol):
    """Texts to unit-length vectors (rows of a float32 array), the same function for tools and queries.

    `embed` is called from a worker thread while an index is built or fed, and from the searching thread for a
    query: it must be safe to call from any thread."""

    @property
    def name(self) -> str:
        """What built the vectors (kind, model, dimensions): an index built by another name is rebuilt."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class WordLlamaEmbedder:
    """The default: WordLlama's static embeddings, from the files its wheel ships."""

    def __init__(self, config: str = "l2_supercat", dim: int = 256) -> None:
        from pathlib import Path

        import wordllama

        here = Path(wordllama.__file__).parent  # its wheel holds weights/ and tokenizers/, as a cache dir would
        self._model = wordllama.WordLlama.load(config, cache_dir=here, dim=dim, disable_download=True)
        self._name = f"wordllama:{config}-{dim}"

    @property
    def name(self) -> str:
        return self._name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        return np.asarray(self._model.embed(list(texts), norm=True), dtype=np.float32)


class SentenceTransformersEmbedder:
    """A sentence-transformers model (`sentence-transformers:all-MiniLM-L6-v2`)."""

    def __init__(self, model: str) -> None:
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(model)
        self._name = f"sentence-transformers:{model}"

    @property
    def name(self) -> str:
        return self._name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        return np.asarray(self._model.encode(list(texts), normalize_embeddings=True), dtype=np.float32)


class FastEmbedEmbedder:
    """A fastembed (ONNX) model (`fastembed:BAAI/bge-small-en-v1.5`)."""

    def __init__(self, model: str) -> None:
        from fastembed import TextEmbedding

        self._model = TextEmbedding(model)
        self._name = f"fastembed:{model}"

    @property
    def name(self) -> str:
        return self._name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return unit(list(self._model.embed(list(texts))))


class OpenAIEmbedder:
    """An OpenAI-compatible embeddings endpoint (`openai:text-embedding-3-small@https://api.openai.com/v1`)."""

    def __init__(self, model: str, base_url: str, key: str | None = None, timeout: float = 10.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)
        self._model = model
        self._name = f"openai:{model}@{base_url}"
        self.embed(["probe"])  # an endpoint that does not answer fails the load, not the first search

    @property
    def name(self) -> str:
        return self._name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows: list[Any] = []
        for start in range(0, len(texts), BATCH):
            answer = self._client.post(
                "/embeddings", json={"model": self._model, "input": list(texts[start : start + BATCH])}
            )
            answer.raise_for_status()
            data = sorted(answer.json()["data"], key=lambda item: item["index"])
            rows += [item["embedding"] for item in data]
        return unit(rows)


def unit(rows: Sequence[Any]) -> np.ndarray:
    """Rows as float32 vectors of length one (a zero row stays zero)."""
    import numpy as np

    matrix = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1, norms)


def make(spec: str, key: str | None = None) -> Embedder:
    """The embedder `spec` names (see the module); raises whatever loading it raised."""
    kind, _, rest = spec.partition(":")
    if spec == DEFAULT:
        return WordLlamaEmbedder()
    if kind == "sentence-transformers" and rest:
        return SentenceTransformersEmbedder(rest)
    if kind == "fastembed" and rest:
        return FastEmbedEmbedder(rest)
    if kind == "openai" and "@" in rest:
        model, _, url = rest.partition("@")
        return OpenAIEmbedder(model, url, key)
    if rest:
        made = getattr(importlib.import_module(kind), rest)()
        if not isinstance(made, Embedder):
            raise TypeError(f"{spec} made a {type(made).__name__}, which has no `name` and `embed`")
        return made
    raise ValueError(f"{spec!r} names no embedder")


RETRY_AFTER = 300.0
"""Seconds after a failed load before the next index build tries again (an endpoint that was down may be up)."""

_loaded: dict[tuple[str, str | None], Embedder] = {}
_failed: dict[tuple[str, str | None], float] = {}
"""(spec, key) -> when loading it last failed."""
_loading = threading.Lock()


def load(spec: str, key: str | None = None) -> Embedder | None:
    """The embedder `spec` names, loaded once per process and shared by every index; None for `bm25`, or when it
    cannot be loaded: then one warning says why (once, however often it is tried again), and searches rank by words
    alone until a build `RETRY_AFTER` seconds later loads it (`expected` tells an index it is due)."""
    if spec == WORDS_ONLY:
        return None
    with _loading:
        if (spec, key) in _loaded:
            return _loaded[spec, key]
        if time.monotonic() - _failed.get((spec, key), -math.inf) < RETRY_AFTER:
            return None
        try:
            _loaded[spec, key] = made = make(spec, key)
        except Exception as exc:  # noqa: BLE001 - any failure to load leaves search to words, said once
            if (spec, key) not in _failed:
                log.warning(
                    "search.embedder_unavailable",
                    embedder=spec,
                    error=f"{type(exc).__name__}: {exc}",
                    fallback="BM25 alone",
                )
            _failed[spec, key] = time.monotonic()
            return None
        if _failed.pop((spec, key), None) is not None:
            log.info("search.embedder_loaded", embedder=made.name)
        return made


def expected(spec: str, key: str | None = None) -> str | None:
    """What an index built now would be built with, without loading anything: the loaded embedder's name, `bm25`
    (words only, or a failed load not yet due for another try), or None when only loading can tell."""
    if spec == WORDS_ONLY:
        return WORDS_ONLY
    with _loading:
        if (spec, key) in _loaded:
            return _loaded[spec, key].name
        if time.monotonic() - _failed.get((spec, key), -math.inf) < RETRY_AFTER:
            return WORDS_ONLY
        return None

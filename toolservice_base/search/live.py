"""`LiveIndex`: a ranker kept in step with a set of tools that changes, built and fed off the event loop.

A live set changes by swaps (an agent's reloads) or is read afresh (the registry's services and static items).
Either way the ranker is fed only what differs between the set it holds and the set it is handed: the tools
that came, the ones whose source is another object that is not equal (an unchanged tool keeps its object, so
this is a pointer comparison for nearly all of them), and the ones that went. An update costs what changed,
never the whole set again.

Off the loop: making documents, staging and committing run in a worker thread; the event loop only compares
(about a millisecond over 10,000 tools) and makes the result visible. The first build is the one large write
(the embedder loaded and every tool embedded: seconds at 10,000 tools): it happens when the ranker is first asked
for, not before, because an agent that never searches would otherwise pay for it (`python -m bench --only
search`: about 97 MB resident and ten threads for an agent of 50 tools, most of it the model and numpy, 165 MB at
10,000, and 0.35 to 2.4 s of CPU). Who asks first waits for
it without holding the loop up; everyone asking meanwhile waits for the same build.

One writer at a time: writes queue behind one lock, each in a task of its own, so a caller that gives up
(cancelled) leaves the write it started to finish rather than a ranker half written. Searches read the last
refreshed view while a write is under way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from ..logs import get_logger
from ..tasks import retrieve_outcome
from .hybrid import ranker_for
from .index import Ranker
from .text import SearchDoc

S = TypeVar("S")
log = get_logger("toolservice_base.search")
_ABSENT = object()


class LiveIndex(Generic[S]):
    """A ranker over a set of `key -> source` kept in step with it; `document(key, source)` says how a source is
    searched, and runs in a worker thread. A mapping handed over must not be changed afterwards (each swap, each
    read, is a new mapping)."""

    def __init__(self, document: Callable[[str, S], SearchDoc], ranker: Callable[[], Ranker] | None = None) -> None:
        self._document = document
        self._make = ranker or ranker_for()
        self._ranker: Ranker | None = None
        self._held: Mapping[str, S] = {}
        """The set the ranker holds (what was last written to it)."""
        self._lock = asyncio.Lock()
        self._writes: set[asyncio.Task[Ranker]] = set()
        self.builds = 0
        """Whole builds (the first, and any after a failed write)."""
        self.updates = 0
        """Writes that changed the ranker after its build (for tests and the benchmark)."""
        self.last_changed = 0
        """Documents the last such write changed."""

    @property
    def built(self) -> bool:
        return self._ranker is not None

    async def sync(self, items: Mapping[str, S]) -> Ranker:
        """The ranker, holding `items`: built over them the first time, then fed what differs. Waits for writes
        queued before this one; never holds the event loop up."""
        ranker = self._ranker
        if ranker is not None and items is self._held and not self._stale(ranker):
            return ranker
        return await asyncio.shield(self._start(items))

    def _stale(self, ranker: Ranker) -> bool:
        """Whether the ranker was built with another embedder than a build now would use (`Rankers.stale`): then
        it is built again, whole."""
        stale = getattr(self._make, "stale", None)
        return bool(stale(ranker)) if stale is not None else False

    def follow(self, items: Mapping[str, S]) -> None:
        """Feed the ranker `items` in the background, if it is built (nothing otherwise: it is built when asked
        for). For a swap, which must not wait for the index: a search that comes before it is written waits for
        it in `sync`."""
        if self._ranker is not None and items is not self._held:
            self._start(items).add_done_callback(retrieve_outcome)  # a failure was logged where it happened

    async def close(self) -> None:
        """Stop the writes under way (a worker thread finishes the step it is in) and let the ranker go."""
        for task in list(self._writes):
            task.cancel()
        await asyncio.gather(*self._writes, return_exceptions=True)
        self._ranker, self._held = None, {}

    def _start(self, items: Mapping[str, S]) -> asyncio.Task[Ranker]:
        task = asyncio.ensure_future(self._write(items))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _write(self, items: Mapping[str, S]) -> Ranker:
        async with self._lock:
            ranker, held = self._ranker, self._held
            if ranker is not None and items is held and not self._stale(ranker):
                return ranker
            try:
                if ranker is None or self._stale(ranker):
                    ranker = await asyncio.to_thread(self._build, dict(items))
                    self.builds += 1
                else:
                    upserts = {k: v for k, v in items.items() if not _same(held.get(k, _ABSENT), v)}
                    gone = [k for k in held if k not in items]
                    if upserts or gone:
                        changed = await asyncio.to_thread(self._feed, ranker, upserts, gone)
                        ranker.refresh()
                        self.updates += 1
                        self.last_changed = changed
            except BaseException as exc:
                # Failed, or stopped while a worker thread may still be writing to it: the ranker is not trusted
                # (nor written to by a second writer); it is built again, whole, when next asked for.
                self._ranker, self._held = None, {}
                if isinstance(exc, Exception):
                    log.exception("search.index_failed", tools=len(items), had=len(held))
                raise
            self._ranker, self._held = ranker, items
            return ranker

    def _build(self, items: dict[str, S]) -> Ranker:
        """In a worker thread: a new ranker over `items`."""
        ranker = self._make()
        ranker.stage({key: self._document(key, source) for key, source in items.items()})
        ranker.commit()
        ranker.refresh()
        return ranker

    def _feed(self, ranker: Ranker, upserts: dict[str, S], gone: list[str]) -> int:
        """In a worker thread: what came or changed, and what went."""
        changed = ranker.stage({key: self._document(key, source) for key, source in upserts.items()}, gone)
        ranker.commit()
        return changed


def _same(old: object, new: object) -> bool:
    return old is new or (old is not _ABSENT and old == new)

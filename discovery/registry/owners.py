"""Who owns each key the registry wrote: kept in step with every service's `owned`, so a write costs its batch, not the
fleet.

The merge rules need, for every service they plan, the owner of each key it
wants and every tool already known by a client name it would take
(`merge.ClientNames`). Gathered afresh from every service for every write
batch, that was a pass over the whole fleet per batch: at 20,000 services,
60 ms of the registry's one core for a batch of ten (`python -m
bench.writer_cost`). Here the answer is kept as the writer commits, and a
batch plans over an `OwnerLayer`: the index underneath, this batch's changes
on top, the index itself untouched until the write is in.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping

from toolservice_base.names import name_keys

from .keys import Key


class Owners:
    """Per workspace: key -> the service that owns it, and name key (`name_keys`) -> the owned tools that have it."""

    def __init__(self) -> None:
        self._keys: dict[str, dict[Key, str]] = {}
        self._names: dict[str, dict[str, set[str]]] = {}
        self.tools = 0
        """Tool keys owned, over every workspace: the tools the registry has in the store."""

    def of(self, workspace: str) -> Mapping[Key, str]:
        return self._keys.get(workspace, {})

    def names(self, workspace: str) -> Mapping[str, set[str]]:
        return self._names.get(workspace, {})

    def owner(self, workspace: str, key: Key) -> str | None:
        return self._keys.get(workspace, {}).get(key)

    def layer(self, workspace: str) -> OwnerLayer:
        """A working copy for one batch's plans: writes go to the layer, never to the index."""
        return OwnerLayer(self._keys.setdefault(workspace, {}), self._names.setdefault(workspace, {}))

    def update(self, workspace: str, service: str, before: Mapping[Key, str], after: Mapping[Key, str]) -> None:
        """`service` owned `before` and now owns `after` (its `owned` was replaced)."""
        keys = self._keys.setdefault(workspace, {})
        names = self._names.setdefault(workspace, {})
        for key in before:
            if key not in after and keys.get(key) == service:
                del keys[key]
                if key[0] == "tool":
                    self.tools -= 1
                    for name_key in name_keys(key[1]):
                        tools = names.get(name_key)
                        if tools is not None:
                            tools.discard(key[1])
                            if not tools:
                                del names[name_key]
        for key in after:
            if keys.get(key) == service:
                continue
            if key[0] == "tool":
                if key not in keys:
                    self.tools += 1
                for name_key in name_keys(key[1]):
                    names.setdefault(name_key, set()).add(key[1])
            keys[key] = service


class OwnerLayer(MutableMapping[Key, str]):
    """The owners as one batch's plans see them: the registry's index with the batch's own changes on top.

    Reads fall through to the index; writes and deletions stay in the layer,
    so a batch that fails to write leaves the index as the store still is.
    `names` is the index's name-key view (read-only here): `ClientNames`
    starts from it instead of from every owned key.
    """

    def __init__(self, base: Mapping[Key, str], names: Mapping[str, set[str]]) -> None:
        self.base = base
        self.names = names
        self.changed: dict[Key, str] = {}
        self.removed: set[Key] = set()
        self._len = len(base)

    def __getitem__(self, key: Key) -> str:
        if key in self.changed:
            return self.changed[key]
        if key in self.removed:
            raise KeyError(key)
        return self.base[key]

    def __contains__(self, key: object) -> bool:
        return key in self.changed or (key not in self.removed and key in self.base)

    def __setitem__(self, key: Key, value: str) -> None:
        if key not in self:
            self._len += 1
        self.changed[key] = value
        self.removed.discard(key)

    def __delitem__(self, key: Key) -> None:
        if key not in self:
            raise KeyError(key)
        self.changed.pop(key, None)
        if key in self.base:
            self.removed.add(key)
        self._len -= 1

    def __iter__(self) -> Iterator[Key]:
        yield from self.changed
        for key in self.base:
            if key not in self.changed and key not in self.removed:
                yield key

    def __len__(self) -> int:
        return self._len

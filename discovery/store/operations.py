"""What each config request does to the store, and what it announces: our protocol and TrustGraph's.

The store speaks TrustGraph 2.11's config protocol (trustgraph-base's
`trustgraph/schema/config.py`, trustgraph-flow's `trustgraph/config/service/`)
so a stock TrustGraph processor loads and follows our tools, plus our
extensions (`expect` preconditions, deletes riding on a `put`, validation of
`tool` and `tool-service` values, no version bump for a write that changes
nothing).

Two protocols:

- `toolreg` (the default): TrustGraph's operations and messages with our
  extensions. A push names only what really changed, except that a change to
  `tool` or `tool-service` in a workspace names *both* types for it:
  TrustGraph's agent (`on_tools_config` in trustgraph-flow's
  `agent/react/service.py`) refetches only the types a push lists and then
  rebuilds its whole tool set from what it fetched, so a push naming only
  `tool-service` would leave it with no tools, and one naming only `tool`
  would fail on "unknown tool-service" and keep stale tools. Workspaces come
  and go (`workspace_changes`) when they get their first item or lose their
  last, and when TrustGraph's `__workspaces__/workspace/<id>` is written.
- `trustgraph`: exactly TrustGraph's store, extensions ignored as its
  deserializer ignores unknown fields: `expect` and a put's `keys` are
  dropped, any value is stored, every put and delete bumps the version and
  pushes the types it names, a `get` answers every key (null when missing),
  a write answers version 0. It exists so the registry's fallback for
  TrustGraph's store is tested against the real behaviour.

Either way, workspaces starting with `_` are stored but never announced.
Nothing here yields: the caller runs `execute` between awaits, so each
request is atomic against every other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from toolservice_base.schemas import (
    CHANGES_OPERATION,
    CHANGES_TOO_OLD,
    CONFIG_OPERATIONS,
    MAX_ITEM_BYTES,
    MAX_PAGE_ITEMS,
    PAGE_BYTES,
    WORKSPACE_OPERATIONS,
    ConfigPush,
    ConfigRequest,
    ConfigResponse,
    ConfigValue,
    ErrorBody,
    WorkspaceChanges,
    is_reserved_workspace,
)
from toolservice_base.schemas.config import ChangedKey

from .changes import TooOld
from .sqlite import Changes, ConfigStore, ExpectationFailed, StoreError, Write

StoreProtocol = Literal["toolreg", "trustgraph"]
STORE_PROTOCOLS: tuple[StoreProtocol, ...] = ("toolreg", "trustgraph")

WORKSPACES_NAMESPACE = "__workspaces__"
WORKSPACE_TYPE = "workspace"
"""TrustGraph declares a workspace by writing `__workspaces__/workspace/<id>`."""
TOOL_TYPES = ("tool", "tool-service")


@dataclass
class Outcome:
    """The answer to one request, the write it made and the push it causes (if any), and workspaces whose request queue
    opens or closes.

    `write` and `push` are apart because not every write is announced: one to
    a reserved workspace (`__template__`, the registry's `_toolreg` records)
    moves the version and pushes nothing. Durability follows `write`, never
    `push`: a replicated store that logged only what it pushed acknowledged
    such writes, then lost them, and its version went back, at a failover.
    """

    response: ConfigResponse
    push: ConfigPush | None = None
    opened: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    write: Write | None = None
    """What the request changed (it moved the version): the journal holds it before the answer is given."""


def answer_size(key: str, value: str | None) -> int:
    """Bytes an item adds to an answer, as the store encodes it (JSON, non-ASCII escaped), plus its field names."""
    return len(json.dumps(key)) + (0 if value is None else len(json.dumps(value))) + ITEM_OVERHEAD


ITEM_OVERHEAD = 64


def refuse_oversize(item_type: str, key: str, value: str) -> None:
    """`StoreError` unless one answer page can carry the item: a store that takes it must be able to give it back."""
    size = len(json.dumps(value))
    if size > MAX_ITEM_BYTES:
        raise StoreError(
            f"{item_type}/{key} is {size} bytes as JSON; the store takes items up to {MAX_ITEM_BYTES} bytes "
            "(the broker's message limit): store it in parts, or keep it elsewhere and store a reference"
        )


def _error(kind: str, message: str, version: int = 0) -> Outcome:
    return Outcome(ConfigResponse(version=version, error=ErrorBody(type=kind, message=message)))


def visible_changes(changes: Changes, *, pair_tools: bool) -> Changes:
    """`changes` without reserved workspaces; with `pair_tools`, `tool` and `tool-service` always travel together."""
    visible = {t: sorted({w for w in ws if not is_reserved_workspace(w)}) for t, ws in changes.items()}
    visible = {t: ws for t, ws in visible.items() if ws}
    if pair_tools:
        paired = sorted({w for t in TOOL_TYPES for w in visible.get(t, [])})
        if paired:
            for t in TOOL_TYPES:
                visible[t] = sorted(set(visible.get(t, [])) | set(paired))
    return dict(sorted(visible.items()))


class ConfigOperations:
    """Runs config requests against a `ConfigStore` in one protocol."""

    def __init__(self, store: ConfigStore, protocol: StoreProtocol = "toolreg") -> None:
        if protocol not in STORE_PROTOCOLS:
            raise ValueError(f"store protocol {protocol!r} is not one of {', '.join(STORE_PROTOCOLS)}")
        self.store = store
        self.protocol = protocol

    @property
    def trustgraph(self) -> bool:
        return self.protocol == "trustgraph"

    def queue_workspaces(self) -> list[str]:
        """Workspaces that get a request queue of their own (`config:<workspace>`) at start."""
        declared = {key for key, _ in self.store.getvalues(WORKSPACES_NAMESPACE, WORKSPACE_TYPE)}
        if not self.trustgraph:
            declared |= set(self.store.workspaces())
        return sorted(w for w in declared if not is_reserved_workspace(w))

    def execute(self, request: ConfigRequest, queue_workspace: str | None = None) -> Outcome:
        """Answer `request`; `queue_workspace` is set when it came on that workspace's own queue (its body's workspace
        is ignored)."""
        op = request.operation
        known = op in CONFIG_OPERATIONS and not (self.trustgraph and op == CHANGES_OPERATION)
        if not known or (queue_workspace is not None and op not in WORKSPACE_OPERATIONS):
            listed = WORKSPACE_OPERATIONS if queue_workspace is not None else CONFIG_OPERATIONS
            allowed = [o for o in listed if not (self.trustgraph and o == CHANGES_OPERATION)]
            return _error("bad-operation", f"unknown operation {op[:64]!r}; use one of {', '.join(allowed)}")
        if op == "getvalues-all-ws":
            rows = self.store.values_all_workspaces(request.type) if request.type else []
            values = [ConfigValue(type=request.type or "", key=k, value=v, workspace=w) for w, k, v in rows]
            return Outcome(ConfigResponse(version=self.store.version, values=values))
        if op == "getkeys-all-ws":
            pairs = self.store.keys_all_workspaces(request.type) if request.type else []
            values = [ConfigValue(type=request.type or "", key=k, workspace=w) for w, k in pairs]
            return Outcome(ConfigResponse(version=self.store.version, values=values))
        workspace = queue_workspace if queue_workspace is not None else self._body_workspace(request)
        if not workspace:
            return _error("bad-request", f"operation '{op}' needs a workspace")
        try:
            if op in ("put", "delete"):
                return self._write(request, workspace)
            return Outcome(self._read(request, workspace))
        except ExpectationFailed as exc:
            return _error("conflict", str(exc), self.store.version)
        except TooOld as exc:
            return _error(CHANGES_TOO_OLD, str(exc), self.store.version)
        except StoreError as exc:
            return _error("config-error" if self.trustgraph else "invalid", str(exc), self.store.version)

    def _body_workspace(self, request: ConfigRequest) -> str:
        if self.trustgraph and "workspace" not in request.model_fields_set:
            return ""  # TrustGraph has no default workspace
        return request.workspace

    def _read(self, request: ConfigRequest, workspace: str) -> ConfigResponse:
        store, op = self.store, request.operation
        if op == "get":
            wanted = [(k.type, k.key) for k in request.keys]
            found = {(t, k): v for t, k, v in store.get(workspace, wanted)}
            if self.trustgraph:  # one value per key asked, null when missing
                values = [ConfigValue(type=t, key=k, value=found.get((t, k))) for t, k in wanted]
            else:
                values = [ConfigValue(type=t, key=k, value=v) for (t, k), v in found.items()]
            return ConfigResponse(version=store.version, values=values)
        if op == CHANGES_OPERATION:
            return self._changes(request, workspace)
        if op in ("list", "getvalues"):
            if not request.type and not self.trustgraph:
                raise StoreError(f"operation '{op}' needs 'type'")
            item_type = request.type or ""
            if request.paged and not self.trustgraph:  # TrustGraph's store knows no pages: it answers everything
                return self._page(request, workspace, item_type)
            if op == "list":
                return ConfigResponse(version=store.version, directory=store.list(workspace, item_type))
            pairs = store.getvalues(workspace, item_type)
            return ConfigResponse(
                version=store.version, values=[ConfigValue(type=item_type, key=k, value=v) for k, v in pairs]
            )
        version, config = store.config(workspace)
        return ConfigResponse(version=version, config=config)

    def _page(self, request: ConfigRequest, workspace: str, item_type: str) -> ConfigResponse:
        """One page of a `list` or `getvalues`: keys after `after`, at most `limit` of them and about `PAGE_BYTES`."""
        listing = request.operation == "list"
        rows, more = self.store.page(
            workspace,
            item_type,
            after=request.after,
            limit=request.limit or MAX_PAGE_ITEMS,
            budget=PAGE_BYTES,
            size=answer_size,
            values=not listing,
        )
        if listing:
            return ConfigResponse(version=self.store.version, directory=[k for k, _ in rows], more=more)
        values = [ConfigValue(type=item_type, key=k, value=v) for k, v in rows]
        return ConfigResponse(version=self.store.version, values=values, more=more)

    def _changes(self, request: ConfigRequest, workspace: str) -> ConfigResponse:
        """One page of what changed in `workspace` since `request.since`: changed keys with their values now, null for
        the deleted, after `<type>/<key>` `after`, in type and key order."""
        if request.since is None:
            raise StoreError(f"operation '{CHANGES_OPERATION}' needs 'since', the version the reader holds")
        after = None
        if request.after is not None:
            item_type, slash, key = request.after.partition("/")
            if not slash:
                raise StoreError(f"'after' of '{CHANGES_OPERATION}' is '<type>/<key>', not {request.after[:80]!r}")
            after = (item_type, key)
        version, changed, more = self.store.changes(
            workspace,
            request.since,
            request.types or (),
            after=after,
            limit=request.limit or MAX_PAGE_ITEMS,
            budget=PAGE_BYTES,
            size=answer_size,
        )
        values = [ConfigValue(type=t, key=k, value=v) for t, k, v in changed]
        return ConfigResponse(version=version, values=values, more=more)

    def _write(self, request: ConfigRequest, workspace: str) -> Outcome:
        puts = [(v.type, v.key, v.value) for v in request.values] if request.operation == "put" else []
        missing = [f"{t}/{k}" for t, k, v in puts if v is None]
        if missing:
            raise StoreError(f"no value for {', '.join(missing[:5])}")
        items = [(t, k, v) for t, k, v in puts if v is not None]
        deletes = [(k.type, k.key) for k in request.keys]
        if self.trustgraph:
            return self._write_as_trustgraph(request.operation, workspace, items, deletes)
        for item_type, key, value in items:
            refuse_oversize(item_type, key, value)
        affected = {workspace} | self._declared(
            workspace,
            [k for _, k, _ in items] + [k for _, k in deletes],
            [t for t, _, _ in items] + [t for t, _ in deletes],
        )
        before = {w: self._exists(w) for w in affected}
        version, changes = self.store.apply(
            workspace, puts=items, deletes=deletes, expect=[(e.type, e.key, e.value) for e in request.expect]
        )
        after = {w: self._exists(w) for w in affected}
        created = sorted(w for w in affected if after[w] and not before[w] and not is_reserved_workspace(w))
        deleted = sorted(w for w in affected if before[w] and not after[w] and not is_reserved_workspace(w))
        lifecycle = WorkspaceChanges(created=created, deleted=deleted) if created or deleted else None
        visible = visible_changes(changes, pair_tools=True)
        push = (
            ConfigPush(version=version, changes=visible, workspace_changes=lifecycle, keys=self._keys(version))
            if visible or lifecycle
            else None
        )
        write = self.store.last_write if changes else None  # an unchanged store keeps its version: nothing to log
        return Outcome(ConfigResponse(version=version), push, opened=created, closed=deleted, write=write)

    def _keys(self, version: int) -> list[ChangedKey] | None:
        """The keys the write that made `version` changed, as its push names them (reserved workspaces: none)."""
        write = self.store.last_write
        if write is None or write.version != version or is_reserved_workspace(write.workspace):
            return None
        return [(write.workspace, t, k, False) for t, k, _ in write.puts] + [
            (write.workspace, t, k, True) for t, k in write.deletes
        ]

    def _write_as_trustgraph(
        self, op: str, workspace: str, items: list[tuple[str, str, str]], deletes: list[tuple[str, str]]
    ) -> Outcome:
        """trustgraph-flow's `handle_put`/`handle_delete`: a put ignores `keys`, a delete ignores `values`, both always
        push."""
        if op == "put":
            version, _ = self.store.apply(workspace, puts=items, validate=False, bump_always=True)
            types = sorted({t for t, _, _ in items})
            named = [k for t, k, _ in items if t == WORKSPACE_TYPE]
        else:
            version, _ = self.store.apply(workspace, deletes=deletes, validate=False, bump_always=True)
            types = sorted({t for t, _ in deletes})
            named = [k for t, k in deletes if t == WORKSPACE_TYPE]
        lifecycle = None
        if workspace == WORKSPACES_NAMESPACE and named:
            lifecycle = WorkspaceChanges(created=named) if op == "put" else WorkspaceChanges(deleted=named)
        changes = visible_changes({t: [workspace] for t in types}, pair_tools=False)
        push = ConfigPush(version=version, changes=changes, workspace_changes=lifecycle)
        queues = [
            w for w in (lifecycle.created + lifecycle.deleted if lifecycle else []) if not is_reserved_workspace(w)
        ]
        return Outcome(
            ConfigResponse(),
            push,
            opened=queues if op == "put" else [],
            closed=queues if op == "delete" else [],
            write=self.store.last_write,  # TrustGraph's store moves the version on every write
        )

    def _declared(self, workspace: str, keys: list[str], types: list[str]) -> set[str]:
        """Workspaces a write to `__workspaces__/workspace/<id>` declares or retires."""
        if workspace != WORKSPACES_NAMESPACE:
            return set()
        return {key for key, item_type in zip(keys, types) if item_type == WORKSPACE_TYPE}

    def _exists(self, workspace: str) -> bool:
        return self.store.has_items(workspace) or bool(
            self.store.get(WORKSPACES_NAMESPACE, [(WORKSPACE_TYPE, workspace)])
        )

"""Pinned tool definitions: a tool that changes what it says after it was accepted waits for an operator.

With `--pin-definitions` (or `"pin-definitions": true` in the trust policy)
the registry pins each announced tool's *definition* the first time it writes
the tool: the sha256 of the canonical JSON of its description, arguments and
config values and its service's queues and config params
(`toolservice_base.schemas.tools.definition_digest`, the same function the
agent bridge and the MCP front show). A later offer of another definition for
that name is *held*:

- The store keeps the pinned one. `hold` builds the offer the merge writes:
  each tool comes from the newest live offer whose definition of it is the
  pinned one; when no instance offers the pinned definition any more, the
  tool is left out (its item is deleted) until an operator decides. So
  nothing of a held definition reaches `tool/<name>`, and from there no
  `ToolSet`, MCP front or `toolreg tools`.
- One `tool-service/<id>` item serves every tool of a service, so it takes
  the queues and params of the newest offer whose service part some pin of
  the service names, or, if no live offer has them, those the pin says: a
  changed queue (which changes every tool's definition) is held with the
  tools, and a tool is never written under queues other than its offer's.
- The offered definition is kept as a *pending change* (`toolreg pending`;
  one per tool, the newest offered) until `toolreg approve` pins it (the
  merge then writes it at once) or `toolreg reject` keeps the pin and adds
  its digest to the pin's rejected list: announcements offering a rejected
  digest are refused at intake, with a row in `toolreg rejections`, and
  their sender is told. A pending change whose service's live instances all
  offer the pinned definition again is dropped; one whose instances went is
  kept (its `last_seen` says when).
- Optionally (`"auto-approve": "same-key-higher-version"` in the trust
  policy) an offer signed by the key that signed the pinned definition,
  under a higher service `version`, is approved without an operator;
  unless it makes the tool riskier by MCP's hints (`escalation`): a tool
  that said it destroys nothing (`destructiveHint: false`, or read-only)
  and now may, or that said it reaches nothing outside
  (`openWorldHint: false`) and now may, waits for an operator whoever
  signed it. The pending diff shows the hint that changed.

Static tools (items an operator wrote) are not pinned: the operator's write
is the approval. A pin is made only for a tool the merge actually owns.

Where they live, one record per tool:

- **Pins**: `discovery-pin/<tool>` in the tool's own workspace, beside the
  `discovery/<service-id>` ownership records. A pin is written in the same
  conditional transaction as the `tool/<name>` item it covers, so no tool is
  ever in the store without its pin (a crash in between cannot let the next
  definition in as a "first" one), and a pin is never written for a tool
  that did not make it in. Agents ignore the type (tool sets read `tool` and
  `tool-service` only; a push naming only `discovery-pin` reloads nothing).
  Pins are never deleted with their tools: a service that goes and comes
  back with another definition is held too.
- **Pending changes**: `pending-definition/<workspace>/<tool>` in the
  reserved workspace `_toolreg`. They carry the offered definition, which
  must not enter a workspace an agent reads (reserved workspaces are stored,
  never pushed, never part of a workspace's `config`). Written when a new
  definition is first held and when it is decided; `last_seen` is kept in
  memory between (the live leases say it).

Both are in the store, so they survive a restart and follow the active
replica (a promoted registry reads them back with its ownership records).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from pydantic import ValidationError

from toolservice_base.logs import get_logger
from toolservice_base.schemas import Announcement
from toolservice_base.schemas.tools import definition_digest, tool_definition

from .keys import Key, unreadable
from .merge import Offer
from .options import AutoApprove
from .pin_rules import (
    MAX_REJECTED,
    PENDING_TYPE,
    PIN_TYPE,
    Candidate,
    Hold,
    Pending,
    Pin,
    PinError,
    PinnedBy,
    ToolKey,
    definition_diff,
    escalation,
    higher,
    hold,
    matches,
    pending_key,
    rejected_reason,
    version_key,
)
from .protocol import PendingChange

__all__ = [
    "PENDING_TYPE",
    "PIN_TYPE",
    "Pending",
    "Pin",
    "PinBook",
    "PinError",
    "hold",
    "rejected_reason",
    "version_key",
]

log = get_logger("discovery.registry")


class PinBook:
    """The pins and pending changes the registry knows, and what of them is still to be written.

    Only the registry's writer task writes them; the query handlers change
    memory and mark what is dirty, like everything else in the registry.
    """

    def __init__(self, auto_approve: AutoApprove | None = None) -> None:
        self.auto_approve = auto_approve
        self._pins: dict[str, dict[str, Pin]] = {}
        """Workspace -> tool -> pin."""
        self.pending: dict[ToolKey, Pending] = {}
        self._dirty_pins: set[ToolKey] = set()
        self._dirty_pending: set[ToolKey] = set()
        self._rejected: set[ToolKey] = set()
        """Tools with at least one rejected digest: only their announces need checking at intake."""
        self._escalations: set[tuple[str, str, str]] = set()
        """(workspace, tool, digest) offers auto-approval passed over for a riskier hint: logged once each."""

    # --- reading ----------------------------------------------------------------

    def of(self, workspace: str) -> Mapping[str, Pin]:
        return self._pins.get(workspace, {})

    def get(self, workspace: str, tool: str) -> Pin | None:
        return self._pins.get(workspace, {}).get(tool)

    def __len__(self) -> int:
        return sum(len(pins) for pins in self._pins.values())

    @property
    def dirty(self) -> bool:
        return bool(self._dirty_pins or self._dirty_pending)

    def dirty_workspaces(self) -> set[str]:
        return {workspace for workspace, _ in self._dirty_pins}

    def dirty_keys(self, workspace: str) -> set[Key]:
        return {(PIN_TYPE, tool) for ws, tool in self._dirty_pins if ws == workspace}

    def refusal(self, announcement: Announcement) -> str | None:
        """Why an announce must be refused: it offers a definition an operator rejected for one of its tools; else
        None."""
        workspace = announcement.workspace
        if not self._rejected or announcement.service is None or announcement.tools is None:
            return None
        for tool in announcement.tools:
            if (workspace, tool.name) not in self._rejected:
                continue
            pin = self.get(workspace, tool.name)
            digest = definition_digest(tool, announcement.service)
            if pin is not None and digest in pin.rejected:
                return rejected_reason(tool.name, digest, pin.digest)
        return None

    def change(self, key: ToolKey, live_seen: float | None, key_names: Mapping[str, str]) -> PendingChange | None:
        """The pending change of a tool as the query API shows it."""
        pending = self.pending.get(key)
        pin = self.get(*key)
        if pending is None or pin is None:
            return None
        signer = key_names.get(pending.signer, pending.signer) if pending.signer else None
        return PendingChange(
            tool=pending.tool,
            service=pending.service,
            workspace=pending.workspace,
            pinned=pin.digest,
            offered=pending.offered,
            diff=definition_diff(pin, pending),
            signer=signer,
            version=pending.version,
            pinned_version=pin.version,
            first_seen=pending.first_seen,
            last_seen=max(pending.last_seen, live_seen or 0.0),
        )

    # --- what the store said ----------------------------------------------------------

    def load_pins(self, workspace: str, values: Mapping[str, str | None]) -> None:
        """Pins read from the store (at start, or with a merge): the store wins, except over a pin not yet written."""
        for tool, value in values.items():
            if (workspace, tool) in self._dirty_pins:
                continue
            pins = self._pins.setdefault(workspace, {})
            if value is None:
                pins.pop(tool, None)
                self._rejected.discard((workspace, tool))
                continue
            try:
                pin = Pin.model_validate_json(value)
            except ValidationError as exc:
                unreadable((PIN_TYPE, tool), exc, workspace)
                continue
            pins[tool] = pin
            if pin.rejected:
                self._rejected.add((workspace, tool))

    def load_pending(self, values: Mapping[str, str]) -> None:
        for key, value in values.items():
            try:
                pending = Pending.model_validate_json(value)
            except ValidationError as exc:
                unreadable((PENDING_TYPE, key), exc)
                continue
            pin = self.get(pending.workspace, pending.tool)
            if pin is not None and (pending.offered == pin.digest or pending.offered in pin.rejected):
                self._dirty_pending.add((pending.workspace, pending.tool))  # decided before a crash: delete it
                continue
            self.pending[(pending.workspace, pending.tool)] = pending

    # --- merging ----------------------------------------------------------------

    def effective(
        self, workspace: str, offers: Sequence[Offer], taken: Callable[[str], bool], wall: float, note: bool
    ) -> Hold:
        """`hold` over this workspace's pins; with `note`, also record what is held (and auto-approve what may be)."""
        result = hold(offers, self.of(workspace), taken)
        if not note:
            return result
        if self.auto_approve is not None and self._auto_approve(workspace, result, wall):
            result = hold(offers, self.of(workspace), taken)
        for name, candidate in result.held.items():
            pin = self.get(workspace, name)
            if pin is not None and candidate.digest not in pin.rejected:
                self._note_pending(workspace, pin, candidate, wall)
        for name in {tool.name for offer in offers for tool in offer.tools} - set(result.held):
            pending = self.pending.get((workspace, name))
            if pending is not None and pending.service == offers[0].service.id:
                self._drop_pending((workspace, name))  # every live instance offers the pinned definition again
        return result

    def _auto_approve(self, workspace: str, result: Hold, wall: float) -> bool:
        """Pin each held offer the `auto-approve` rule lets in without an operator (logged, as an operator's approval
        is); whether any was, so the merge holds again on the new pins."""
        approved = [
            candidate for name, candidate in result.held.items() if self._auto_approvable(workspace, name, candidate)
        ]
        for candidate in approved:
            old = self.get(workspace, candidate.tool.name)
            self._set_pin(workspace, candidate, wall, by="auto-approve")
            log.warning(
                "definition.auto_approved",
                tool=candidate.tool.name,
                service=candidate.offer.service.id,
                workspace=workspace,
                digest=candidate.digest,
                pinned=old.digest if old else None,
                version=candidate.offer.version,
                pinned_version=old.version if old else None,
                rule=self.auto_approve,
            )
        return bool(approved)

    def _auto_approvable(self, workspace: str, name: str, candidate: Candidate) -> bool:
        pin = self.get(workspace, name)
        if not (
            self.auto_approve == "same-key-higher-version"
            and pin is not None
            and candidate.digest not in pin.rejected
            and pin.signer is not None
            and candidate.offer.signer == pin.signer
            and higher(candidate.offer.version, pin.version)
        ):
            return False
        riskier = escalation(pin.definition, tool_definition(candidate.tool, candidate.offer.service))
        if riskier is not None:
            self._passed_over(workspace, name, candidate.digest, riskier)
            return False
        return True

    def _passed_over(self, workspace: str, name: str, digest: str, reason: str) -> None:
        """Log, once per offer, that auto-approval left a riskier hint to an operator."""
        if (workspace, name, digest) in self._escalations:
            return
        if len(self._escalations) >= MAX_REJECTED * 128:
            self._escalations.clear()
        self._escalations.add((workspace, name, digest))
        log.warning(
            "definition.not_auto_approved",
            tool=name,
            workspace=workspace,
            offered=digest,
            reason=reason,
            note="an operator decides: `toolreg pending` shows the diff",
        )

    def _note_pending(self, workspace: str, pin: Pin, candidate: Candidate, wall: float) -> None:
        key = (workspace, candidate.tool.name)
        known = self.pending.get(key)
        if known is not None and known.offered == candidate.digest and known.pinned == pin.digest:
            return
        self.pending[key] = Pending(
            tool=candidate.tool.name,
            workspace=workspace,
            service=candidate.offer.service.id,
            pinned=pin.digest,
            offered=candidate.digest,
            definition=tool_definition(candidate.tool, candidate.offer.service),
            version=candidate.offer.version,
            signer=candidate.offer.signer,
            first_seen=wall,
            last_seen=wall,
        )
        self._dirty_pending.add(key)
        log.warning(
            "definition.held",
            tool=candidate.tool.name,
            service=candidate.offer.service.id,
            workspace=workspace,
            pinned=pin.digest,
            offered=candidate.digest,
            version=candidate.offer.version,
            note=(
                "agents keep the pinned definition; `toolreg pending` shows the diff, `toolreg approve` or `toolreg"
                " reject` decides"
            ),
        )

    def first_pins(
        self, workspace: str, service: str, offer: Offer, names: Iterable[str], wall: float
    ) -> dict[str, Pin]:
        """Pins for tools the merge is about to own that have none yet (not kept until the write succeeds)."""
        pins: dict[str, Pin] = {}
        for name in names:
            tool = offer.tool(name)
            if tool is None or self.get(workspace, name) is not None:
                continue
            pins[name] = Pin(
                tool=name,
                workspace=workspace,
                service=service,
                digest=offer.digests[name],
                definition=tool_definition(tool, offer.service),
                version=offer.version,
                signer=offer.signer,
                at=round(wall, 3),
            )
        return pins

    def to_write(self, workspace: str, fresh: Mapping[str, Pin]) -> dict[Key, str]:
        """Values of the pins this workspace's next transaction writes: new ones, and those changed by a decision."""
        values = {(PIN_TYPE, name): pin.to_value() for name, pin in fresh.items()}
        for ws, name in self._dirty_pins:
            pin = self.get(ws, name)
            if ws == workspace and pin is not None:
                values[(PIN_TYPE, name)] = pin.to_value()
        return values

    def written(self, workspace: str, values: Mapping[Key, str], fresh: Mapping[str, Pin]) -> None:
        """The transaction holding `values` is in the store: keep the new pins, and forget what is no longer dirty."""
        pins = self._pins.setdefault(workspace, {})
        for name, pin in fresh.items():
            pins.setdefault(name, pin)
            log.info(
                "definition.pinned",
                tool=name,
                service=pin.service,
                workspace=workspace,
                digest=pin.digest,
                version=pin.version,
            )
        for (_, name), value in values.items():
            current = pins.get(name)
            if current is not None and current.to_value() == value:
                self._dirty_pins.discard((workspace, name))

    def pending_writes(self) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]], set[ToolKey]]:
        """(puts, deletes) for `_toolreg`, and the keys they cover (`pending_written` once they are in)."""
        keys = set(self._dirty_pending)
        puts = [
            (PENDING_TYPE, pending_key(*key), self.pending[key].to_value())
            for key in sorted(keys)
            if key in self.pending
        ]
        deletes = [(PENDING_TYPE, pending_key(*key)) for key in sorted(keys) if key not in self.pending]
        return puts, deletes, keys

    def pending_written(self, keys: set[ToolKey]) -> None:
        self._dirty_pending -= keys

    # --- decisions ----------------------------------------------------------------

    def decide(self, workspace: str, tool: str, digest: str | None) -> Pending:
        """The pending change an operator's `approve`/`reject` is about; PinError if there is none, or `digest` is not
        it."""
        pending = self.pending.get((workspace, tool))
        pin = self.get(workspace, tool)
        if pending is None or pin is None:
            where = (
                f"pinned at {pin.digest[:12]}; no other definition is offered"
                if pin is not None
                else "no definition of it is pinned yet"
            )
            raise PinError("nothing-pending", f"nothing pending for tool {tool!r} in workspace {workspace!r}: {where}")
        if not matches(pending.offered, digest):
            raise PinError(
                "digest-mismatch",
                f"--digest {digest} is not the definition offered for {tool!r} (offered: {pending.offered[:12]}); see"
                " `toolreg pending`",
            )
        return pending

    def approve(self, pending: Pending, wall: float) -> Pin:
        """Pin the offered definition (written with the next merge, with the tool)."""
        key = (pending.workspace, pending.tool)
        old = self.get(*key)
        rejected = tuple(d for d in (old.rejected if old else ()) if d != pending.offered)
        pin = Pin(
            tool=pending.tool,
            workspace=pending.workspace,
            service=pending.service,
            digest=pending.offered,
            definition=pending.definition,
            version=pending.version,
            signer=pending.signer,
            at=round(wall, 3),
            by="operator",
            rejected=rejected,
        )
        self._put_pin(pin)
        self._drop_pending(key)
        return pin

    def reject(self, pending: Pending) -> Pin:
        """Keep the pin; its digest is refused from now on."""
        key = (pending.workspace, pending.tool)
        old = self.get(*key)
        assert old is not None
        rejected = tuple(d for d in old.rejected if d != pending.offered)[-(MAX_REJECTED - 1) :] + (pending.offered,)
        pin = old.model_copy(update={"rejected": rejected})
        self._put_pin(pin)
        self._drop_pending(key)
        return pin

    def _set_pin(self, workspace: str, candidate: Candidate, wall: float, by: PinnedBy) -> None:
        old = self.get(workspace, candidate.tool.name)
        self._put_pin(
            Pin(
                tool=candidate.tool.name,
                workspace=workspace,
                service=candidate.offer.service.id,
                digest=candidate.digest,
                definition=tool_definition(candidate.tool, candidate.offer.service),
                version=candidate.offer.version,
                signer=candidate.offer.signer,
                at=round(wall, 3),
                by=by,
                rejected=old.rejected if old else (),
            )
        )
        self._drop_pending((workspace, candidate.tool.name))

    def _put_pin(self, pin: Pin) -> None:
        key = (pin.workspace, pin.tool)
        self._pins.setdefault(pin.workspace, {})[pin.tool] = pin
        self._dirty_pins.add(key)
        if pin.rejected:
            self._rejected.add(key)
        else:
            self._rejected.discard(key)

    def _drop_pending(self, key: ToolKey) -> None:
        if self.pending.pop(key, None) is not None:
            self._dirty_pending.add(key)

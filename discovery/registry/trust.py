"""The registry's trust policy: which keys may announce which services and tools.

A policy file is JSON, edited with `toolreg trust add` or by hand:

    {"keys": [{"name": "jokes-team",
               "public-key": "<base64 of 32 bytes>",
               "services": ["joke-*"],
               "tools": ["tell-*"],
               "workspaces": ["default", "team-*"]}]}

Patterns are shell-style (`fnmatch`, case-sensitive). With a policy, an
announcement is accepted only if it is signed by a listed key whose patterns
cover its service id, every tool name it claims, and the workspace it
announces into. `workspaces` is optional: left out, the key may announce into
every workspace (so a file written before it existed means what it meant).
Without a policy, every valid announcement is accepted: the laptop default,
which the registry says out loud at start.

Two optional top-level keys govern pinned definitions (`registry.pins`):

    {"pin-definitions": true,
     "auto-approve": "same-key-higher-version",
     "keys": [...]}

- `"pin-definitions": true` does what `toolreg up --pin-definitions` does:
  each tool's definition is pinned when first accepted, and a changed one is
  held until `toolreg approve` (either one turns pinning on).
- `"auto-approve": "same-key-higher-version"` approves a held definition
  without an operator when it is signed by the same key that signed the
  pinned one and its service `version` is higher (dotted numbers, `1.10` >
  `1.9`; any other version is never higher). Only with pinning on.

Two more cover the config queue (`discovery.store.write_policy`):

    {"config-writes": "signed",
     "operators": [{"name": "alice", "public-key": "<base64 of 32 bytes>"}],
     "keys": [...]}

- `"config-writes": "signed"`: the store takes a write of `tool` or
  `tool-service` items, or of the registry's own records (`discovery`,
  `discovery-pin`, `pending-definition`, workspace `_toolreg`), only if one
  of the `operators` signed it (`toolreg config put --signing-key`), or the
  registry did; each signed write is taken once. `"any"` (the default)
  leaves the config queue to the broker's permissions: the policy then
  covers announcements only, and `toolreg up` says so.

One more names the MCP fronts whose audit records are believed
(`discovery.audit_chain`; `toolreg trust add-front`):

    {"audit-fronts": [{"name": "front-eu", "public-key": "<base64 of 32 bytes>"}],
     "keys": [...]}

The registry's page counts only records signed by one of them, and
`toolreg audit verify` checks the audit topic against them. They decide
nothing about announcements or writes (and are no part of `content`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.schemas import NAME_PATTERN, Announcement
from toolservice_base.signing import (
    SigningError,
    key_id,
    parse_public_key,
    public_key_text,
    signature_key_id,
    verify,
)

from .options import AUTO_APPROVE, AutoApprove

PATTERN = re.compile(r"^[A-Za-z0-9_.*?\[\]!-]{1,128}$")


EVERY_WORKSPACE: tuple[str, ...] = ("*",)


class PolicyError(ToolDiscoveryError, ValueError):
    """The policy file is unreadable or malformed; the message names the entry."""


@dataclass(frozen=True)
class TrustedKey:
    name: str
    public_key: Ed25519PublicKey
    services: tuple[str, ...]
    tools: tuple[str, ...]
    text: str = ""
    workspaces: tuple[str, ...] = EVERY_WORKSPACE
    """Workspaces it may announce into (patterns); `("*",)`, the default, is every one."""

    @property
    def id(self) -> str:
        return key_id(self.public_key)

    def allows(self, service_id: str, tool_names: list[str], workspace: str | None = None) -> str | None:
        """None if allowed, else the reason it is not. `workspace` None: the workspace is not judged."""
        if workspace is not None and not any(fnmatchcase(workspace, p) for p in self.workspaces):
            return f"key {self.name!r} may not announce into workspace {workspace!r}"
        if not any(fnmatchcase(service_id, p) for p in self.services):
            return f"key {self.name!r} may not announce service {service_id!r}"
        for tool in tool_names:
            if not any(fnmatchcase(tool, p) for p in self.tools):
                return f"key {self.name!r} may not announce tool {tool!r}"
        return None

    def scope(self) -> str:
        """What it may do, in one line: `services joke-* with tools tell-* in every workspace`."""
        where = "every workspace" if self.workspaces == EVERY_WORKSPACE else f"workspaces {', '.join(self.workspaces)}"
        return f"services {', '.join(self.services)} with tools {', '.join(self.tools)} in {where}"

    def to_entry(self) -> dict[str, object]:
        """Its entry in the policy file; `workspaces` only when it is not every workspace."""
        entry: dict[str, object] = {
            "name": self.name,
            "public-key": self.text,
            "services": list(self.services),
            "tools": list(self.tools),
        }
        if self.workspaces != EVERY_WORKSPACE:
            entry["workspaces"] = list(self.workspaces)
        return entry


CONFIG_WRITES = ("any", "signed")


@dataclass(frozen=True)
class OperatorKey:
    """A key whose signature lets a write of tools through the config queue (`"operators"` in the policy)."""

    name: str
    public_key: Ed25519PublicKey
    text: str

    @property
    def id(self) -> str:
        return key_id(self.public_key)


@dataclass
class TrustPolicy:
    keys: dict[str, TrustedKey] = field(default_factory=dict)
    path: Path | None = None
    pin_definitions: bool = False
    """`"pin-definitions": true`: pin each tool's definition when first accepted (as `--pin-definitions`)."""
    auto_approve: AutoApprove | None = None
    """`"auto-approve"`: which held definitions are approved without an operator (`same-key-higher-version`)."""
    config_writes: str = "any"
    """`"config-writes"`: `signed` makes the store take writes of tools only when an operator (or the registry) signed
    them; `any` leaves the config queue to the broker's permissions."""
    operators: dict[str, OperatorKey] = field(default_factory=dict)
    """`"operators"`, by key id: who may sign a write of tools."""
    fronts: dict[str, OperatorKey] = field(default_factory=dict)
    """`"audit-fronts"`, by key id: the MCP fronts whose signed audit records are believed."""

    def front_keys(self) -> dict[str, Ed25519PublicKey]:
        """The audit fronts' public keys by key id, as `audit_chain.AuditVerifier` takes them."""
        return {kid: key.public_key for kid, key in self.fronts.items()}

    @classmethod
    def load(cls, path: str | Path) -> "TrustPolicy":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise PolicyError(f"trust policy {path} not found; create it with `toolreg trust add`") from None
        except (OSError, ValueError) as exc:
            raise PolicyError(f"trust policy {path} is not readable JSON: {exc}") from None
        entries = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise PolicyError(f'trust policy {path}: expected {{"keys": [...]}}')
        policy = cls(path=path)
        _parse_pinning(policy, data, str(path))
        _parse_config_writes(policy, data, str(path))
        _parse_fronts(policy, data, str(path))
        for number, entry in enumerate(entries, 1):
            policy.add(_parse_entry(entry, f"{path} entry {number}"))
        return policy

    def add(self, key: TrustedKey) -> None:
        self.keys[key.id] = key

    def check(
        self, announcement: Announcement, service_id: str | None, tool_names: list[str], workspace: str | None = None
    ) -> str | None:
        """None if the announcement may claim `service_id` and `tool_names` in `workspace`, else why not.

        `workspace` None: the one the announcement names. `service_id` None (a
        heartbeat or withdraw from an instance the registry does not know)
        checks only that a trusted key signed it: an outsider must not be able
        to spend the registry's probes or sequence memory.
        """
        kid = signature_key_id(announcement)
        if kid is None:
            return "unsigned announcement (a trust policy is configured)"
        key = self.keys.get(kid)
        if key is None:
            return f"signed by unknown key {kid}"
        if not verify(announcement, key.public_key):
            return f"bad signature for key {key.name!r}"
        if service_id is None:
            return None
        return key.allows(service_id, tool_names, announcement.workspace if workspace is None else workspace)

    def signed_by(self, announcement: Announcement, key_id: str) -> bool:
        """True when `announcement` carries a valid signature by the trusted key `key_id`."""
        key = self.keys.get(key_id)
        return key is not None and signature_key_id(announcement) == key_id and verify(announcement, key.public_key)

    def content(self) -> dict[str, object]:
        """What the policy decides, canonically: each key's public key (its raw bytes, base64) and scopes, and the
        policy's settings. Equal for equal policies in any process (what the replicas' settings digest hashes); a
        key's name, which decides nothing, is left out."""
        keys = sorted(
            [public_key_text(k.public_key), sorted(k.services), sorted(k.tools), sorted(k.workspaces)]
            for k in self.keys.values()
        )
        return {
            "keys": keys,
            "pin-definitions": self.pin_definitions,
            "auto-approve": self.auto_approve,
            "config-writes": self.config_writes,
            "operators": sorted(public_key_text(k.public_key) for k in self.operators.values()),
        }

    def to_json(self) -> str:
        entries = [k.to_entry() for k in sorted(self.keys.values(), key=lambda k: k.name)]
        document: dict[str, object] = {}
        if self.pin_definitions:
            document["pin-definitions"] = True
        if self.auto_approve is not None:
            document["auto-approve"] = self.auto_approve
        if self.config_writes != "any":
            document["config-writes"] = self.config_writes
        for name, chosen in (("operators", self.operators), ("audit-fronts", self.fronts)):
            if chosen:
                document[name] = [
                    {"name": k.name, "public-key": k.text} for k in sorted(chosen.values(), key=lambda k: k.name)
                ]
        document["keys"] = entries
        return json.dumps(document, indent=2) + "\n"

    def save(self, path: str | Path | None = None) -> Path:
        target = Path(path or self.path or "trust.json")
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, target)
        return target


def _parse_pinning(policy: TrustPolicy, data: dict[str, object], where: str) -> None:
    pin = data.get("pin-definitions", False)
    if not isinstance(pin, bool):
        raise PolicyError(f"trust policy {where}: 'pin-definitions' must be true or false")
    policy.pin_definitions = pin
    auto = data.get("auto-approve")
    if auto is not None and auto not in AUTO_APPROVE:
        raise PolicyError(f"trust policy {where}: 'auto-approve' must be one of: {', '.join(AUTO_APPROVE)}")
    policy.auto_approve = auto


def _parse_config_writes(policy: TrustPolicy, data: dict[str, object], where: str) -> None:
    writes = data.get("config-writes", "any")
    if writes not in CONFIG_WRITES:
        raise PolicyError(f"trust policy {where}: 'config-writes' must be one of: {', '.join(CONFIG_WRITES)}")
    policy.config_writes = str(writes)
    operators = data.get("operators", [])
    if not isinstance(operators, list):
        raise PolicyError(f"trust policy {where}: 'operators' must be a list of {{name, public-key}}")
    for number, entry in enumerate(operators, 1):
        key = operator_key(entry, f"{where} operator {number}")
        policy.operators[key.id] = key
    if policy.config_writes == "signed" and not policy.operators:
        raise PolicyError(
            f"trust policy {where}: 'config-writes' is signed but no operator key may sign (add one with `toolreg"
            " trust add-operator NAME --public-key KEY`)"
        )


def _parse_fronts(policy: TrustPolicy, data: dict[str, object], where: str) -> None:
    fronts = data.get("audit-fronts", [])
    if not isinstance(fronts, list):
        raise PolicyError(f"trust policy {where}: 'audit-fronts' must be a list of {{name, public-key}}")
    for number, entry in enumerate(fronts, 1):
        key = operator_key(entry, f"{where} audit front {number}")
        policy.fronts[key.id] = key


def operator_key(entry: object, where: str) -> OperatorKey:
    """An `operators` (or `audit-fronts`) entry (`{"name", "public-key"}`), checked as a trusted key's are."""
    if not isinstance(entry, dict):
        raise PolicyError(f"{where}: expected an object")
    name, text = entry.get("name"), entry.get("public-key")
    if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
        raise PolicyError(f"{where}: 'name' must match {NAME_PATTERN}")
    if not isinstance(text, str):
        raise PolicyError(f"{where}: 'public-key' is missing")
    try:
        return OperatorKey(name, parse_public_key(text), text.strip())
    except SigningError as exc:
        raise PolicyError(f"{where}: {exc}") from None


def _parse_entry(entry: object, where: str) -> TrustedKey:
    if not isinstance(entry, dict):
        raise PolicyError(f"{where}: expected an object")
    name = entry.get("name")
    if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
        raise PolicyError(f"{where}: 'name' must match {NAME_PATTERN}")
    text = entry.get("public-key")
    if not isinstance(text, str):
        raise PolicyError(f"{where}: 'public-key' is missing")
    try:
        public = parse_public_key(text)
    except SigningError as exc:
        raise PolicyError(f"{where}: {exc}") from None
    patterns: dict[str, tuple[str, ...]] = {"workspaces": EVERY_WORKSPACE}
    for kind in ("services", "tools", "workspaces"):
        if kind == "workspaces" and kind not in entry:
            continue
        value = entry.get(kind)
        if not isinstance(value, list) or not value or not all(isinstance(p, str) and PATTERN.match(p) for p in value):
            example = "team-*" if kind == "workspaces" else "joke-*"
            raise PolicyError(f"{where}: '{kind}' must be a non-empty list of name patterns like \"{example}\"")
        patterns[kind] = tuple(value)
    return TrustedKey(
        name=name,
        public_key=public,
        services=patterns["services"],
        tools=patterns["tools"],
        text=text.strip(),
        workspaces=_every_if_any(patterns["workspaces"]),
    )


def _every_if_any(workspaces: tuple[str, ...]) -> tuple[str, ...]:
    """`["*", "x"]` is every workspace: said (and saved) as `("*",)`."""
    return EVERY_WORKSPACE if "*" in workspaces else tuple(dict.fromkeys(workspaces))


def trusted_key(
    name: str, public_key_text: str, services: list[str], tools: list[str], workspaces: list[str] | None = None
) -> TrustedKey:
    """Build an entry from CLI input, with the same checks as a file entry; `workspaces` None: every workspace."""
    entry: dict[str, object] = {"name": name, "public-key": public_key_text, "services": services, "tools": tools}
    if workspaces is not None:
        entry["workspaces"] = workspaces
    return _parse_entry(entry, f"key {name!r}")


def policy_from(path: str | Path | None) -> TrustPolicy | None:
    """The policy at `path` (a flag, else `RegistrySettings.trust_policy`), else None (accept every valid
    announcement)."""
    return TrustPolicy.load(path) if path else None

"""Who may call what through the MCP front: an access policy mapping scopes and claims to tools and workspaces.

A policy file is JSON, like the registry's trust policy:

    {"required-scopes": ["mcp"],
     "rules": [{"name": "calculator users",
                "scopes": ["tools:calc"],
                "tools": ["calculate", "calc.*"],
                "workspaces": ["default"]},
               {"name": "operators",
                "claims": {"groups": "tool-admins"},
                "tools": ["*"]}]}

A rule applies to a caller whose token carries every scope in `scopes` and
matches every entry of `claims` (a dotted name reaches into nested claims,
`realm_access.roles`; the token's value matches when it equals the rule's,
or is a list holding it; the rule's value may be a list of acceptable
ones). A rule with neither applies to every valid token. It grants the
tools matching its `tools` patterns (shell-style, case-sensitive, matched
against a tool's own name and its MCP name) in the workspaces matching
`workspaces` (every one when left out). What no rule grants is refused: a
caller's tools/list shows only what it may call, and a call to anything
else is a tool error naming what would grant it. `required-scopes` are
asked of every token before any request reaches MCP (HTTP 403
`insufficient_scope`, the specification's step-up signal).

Without a policy every valid token may call every tool the front serves.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from mcp.server.auth.provider import AccessToken

from toolservice_base.errors import ToolDiscoveryError

EVERY = ("*",)


class AccessPolicyError(ToolDiscoveryError, ValueError):
    """The access policy file is unreadable or malformed; the message names the entry."""


@dataclass(frozen=True)
class Caller:
    """Who is calling: from an OAuth token, or what the transport knows (`stdio`, a static bearer token, nobody)."""

    subject: str
    client_id: str = ""
    scopes: frozenset[str] = frozenset()
    claims: Mapping[str, Any] = field(default_factory=dict)
    authenticated: bool = False
    """Identified by an OAuth access token (the policy applies); False: the front's one local or static-token
    caller."""

    @classmethod
    def of_token(cls, token: AccessToken) -> Caller:
        return cls(
            subject=token.subject or token.client_id or "?",
            client_id=token.client_id,
            scopes=frozenset(token.scopes),
            claims=token.claims or {},
            authenticated=True,
        )


def claim(claims: Mapping[str, Any], name: str) -> Any:
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _matches(given: Any, wanted: tuple[str, ...]) -> bool:
    values = given if isinstance(given, list) else [given]
    return any(isinstance(v, str | int | bool) and str(v) in wanted for v in values)


@dataclass(frozen=True)
class Rule:
    name: str
    tools: tuple[str, ...]
    scopes: frozenset[str] = frozenset()
    claims: tuple[tuple[str, tuple[str, ...]], ...] = ()
    workspaces: tuple[str, ...] = EVERY

    def applies_to(self, caller: Caller) -> bool:
        return self.scopes <= caller.scopes and all(_matches(claim(caller.claims, n), v) for n, v in self.claims)

    def covers(self, workspace: str, names: Iterable[str]) -> bool:
        return any(fnmatchcase(workspace, w) for w in self.workspaces) and any(
            fnmatchcase(name, pattern) for name in names for pattern in self.tools
        )

    def requirement(self) -> str:
        """What a caller needs for this rule, in words: `scope tools:calc`, `claim groups=tool-admins`."""
        parts = [f"scope {s}" for s in sorted(self.scopes)]
        parts += [f"claim {n}={'|'.join(v)}" for n, v in self.claims]
        return " and ".join(parts) or "any valid token"


@dataclass(frozen=True)
class Rights:
    """The rules that apply to one caller in one workspace: what it may call."""

    rules: tuple[Rule, ...]
    workspace: str
    everything: bool = False

    def allows(self, *names: str) -> bool:
        return self.everything or any(rule.covers(self.workspace, names) for rule in self.rules)


ALL_RIGHTS_KEY = "*"


@dataclass(frozen=True)
class AccessPolicy:
    rules: tuple[Rule, ...] = ()
    required_scopes: tuple[str, ...] = ()
    source: str = ""

    def rights(self, caller: Caller, workspace: str) -> Rights:
        applying = tuple(rule for rule in self.rules if rule.applies_to(caller))
        return Rights(applying, workspace)

    def needed(self, workspace: str, *names: str) -> list[str]:
        """What would let a caller call the tool named `names`: one requirement per rule granting it."""
        return [rule.requirement() for rule in self.rules if rule.covers(workspace, names)]

    def scopes_granting(self, workspace: str, *names: str) -> list[str]:
        """The scopes of the rules granting `names` that need nothing but scopes: what a step-up would ask for."""
        found: list[str] = []
        for rule in self.rules:
            if rule.covers(workspace, names) and rule.scopes and not rule.claims:
                found += [s for s in sorted(rule.scopes) if s not in found]
        return found

    def scopes(self) -> list[str]:
        """Every scope the policy names, for the protected resource metadata's `scopes_supported`."""
        named = list(self.required_scopes)
        for rule in self.rules:
            named += [s for s in sorted(rule.scopes) if s not in named]
        return named

    @classmethod
    def load(cls, path: Path) -> AccessPolicy:
        try:
            document = json.loads(path.read_text())
        except OSError as exc:
            raise AccessPolicyError(f"cannot read the access policy {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise AccessPolicyError(f"the access policy {path} is not JSON: {exc}") from None
        return cls.of(document, str(path))

    @classmethod
    def of(cls, document: Any, source: str = "the access policy") -> AccessPolicy:
        if not isinstance(document, dict) or not isinstance(document.get("rules"), list):
            raise AccessPolicyError(f'{source} must be a JSON object with a "rules" list')
        unknown = set(document) - {"rules", "required-scopes"}
        if unknown:
            raise AccessPolicyError(f"{source} has unknown keys {sorted(unknown)}; use rules and required-scopes")
        rules = tuple(_rule(entry, f"{source} rule {n + 1}") for n, entry in enumerate(document["rules"]))
        required = _strings(document.get("required-scopes", []), f"{source} required-scopes")
        return cls(rules=rules, required_scopes=required, source=source)


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v and len(v) <= 256 for v in value):
        raise AccessPolicyError(f"{where} must be a list of non-empty strings")
    return tuple(value)


def _rule(entry: Any, where: str) -> Rule:
    if not isinstance(entry, dict):
        raise AccessPolicyError(f"{where} must be a JSON object")
    unknown = set(entry) - {"name", "scopes", "claims", "tools", "workspaces"}
    if unknown:
        raise AccessPolicyError(
            f"{where} has unknown keys {sorted(unknown)}; use name, scopes, claims, tools, workspaces"
        )
    name = entry.get("name", where)
    if "tools" not in entry:
        raise AccessPolicyError(f'{where} names no "tools" (a list of tool-name patterns)')
    claims = entry.get("claims", {})
    if not isinstance(claims, dict):
        raise AccessPolicyError(f"{where} claims must be an object of claim name to value (or list of values)")
    return Rule(
        name=str(name),
        tools=_strings(entry["tools"], f"{where} tools"),
        scopes=frozenset(_strings(entry.get("scopes", []), f"{where} scopes")),
        claims=tuple((str(k), _strings(v, f"{where} claim {k}")) for k, v in sorted(claims.items())),
        workspaces=_strings(entry.get("workspaces", list(EVERY)), f"{where} workspaces"),
    )

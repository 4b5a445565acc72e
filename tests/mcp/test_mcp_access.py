"""The MCP front's access policy, rate limiter and the command's refusals: what is decided before any token or broker
is involved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import toolreg, toolreg_env

from discovery.mcp.auth import AccessPolicy, AccessPolicyError, Caller, RateLimiter
from discovery.mcp.auth.tokens import canonical

POLICY = {
    "required-scopes": ["mcp"],
    "rules": [
        {"name": "calc", "scopes": ["tools:calc"], "tools": ["calc*"], "workspaces": ["default", "team-*"]},
        {"name": "ops", "claims": {"realm_access.roles": ["tool-admin", "root"]}, "tools": ["*"]},
        {"name": "all", "tools": ["public.*"]},
    ],
}


def caller(*scopes: str, **claims: object) -> Caller:
    return Caller("someone", scopes=frozenset(scopes), claims=claims, authenticated=True)


def test_a_rule_grants_its_tools_in_its_workspaces_to_tokens_with_its_scopes_or_claims() -> None:
    policy = AccessPolicy.of(POLICY)
    calc = policy.rights(caller("mcp", "tools:calc"), "team-a")
    assert calc.allows("calculate") and calc.allows("public.time") and not calc.allows("echo")
    assert not policy.rights(caller("mcp", "tools:calc"), "research").allows("calculate")
    admin = policy.rights(caller("mcp", realm_access={"roles": ["viewer", "tool-admin"]}), "research")
    assert admin.allows("echo") and admin.allows("anything")
    assert not policy.rights(caller("mcp", realm_access={"roles": "viewer"}), "default").allows("echo")
    assert policy.needed("default", "calculate") == ["scope tools:calc", "claim realm_access.roles=tool-admin|root"]
    assert policy.scopes_granting("default", "calculate") == ["tools:calc"]
    assert policy.scopes() == ["mcp", "tools:calc"]


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ([], 'must be a JSON object with a "rules" list'),
        ({"rules": [{"scopes": ["a"]}]}, 'rule 1 names no "tools"'),
        ({"rules": [{"tools": "x", "scope": ["a"]}]}, "rule 1 has unknown keys ['scope']"),
        ({"rules": [{"tools": [""]}]}, "rule 1 tools must be a list of non-empty strings"),
        ({"rules": [], "required_scopes": []}, "unknown keys ['required_scopes']"),
        ({"rules": [{"tools": ["*"], "claims": ["groups"]}]}, "claims must be an object"),
    ],
)
def test_a_malformed_policy_is_one_line_naming_the_entry(document: object, says: str) -> None:
    with pytest.raises(AccessPolicyError) as refused:
        AccessPolicy.of(document, "access.json")
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_the_rate_limiter_allows_a_burst_then_the_rate_and_forgets_whoever_has_refilled() -> None:
    limiter = RateLimiter(10, max_callers=3)
    assert [limiter.take("a", now=100.0) for _ in range(10)] == [0.0] * 10
    assert limiter.take("a", now=100.0) == pytest.approx(0.1)
    assert limiter.take("b", now=100.0) == 0.0  # another caller has a bucket of its own
    assert limiter.take("a", now=100.25) == 0.0 and limiter.take("a", now=100.25) == 0.0
    assert limiter.take("a", now=100.25) == pytest.approx(0.05)
    limiter.take("c", now=200.0)  # everyone else refilled long ago: no bucket kept for them
    assert len(limiter) == 1
    for n in range(10):
        for _ in range(10):
            limiter.take(f"x{n}", now=300.0)
    assert len(limiter) <= 3  # never more than max_callers


def test_resource_uris_compare_as_the_spec_says() -> None:
    assert canonical("HTTPS://MCP.Example.com:443/mcp/") == "https://mcp.example.com/mcp"
    assert canonical("http://127.0.0.1:8765/mcp") == "http://127.0.0.1:8765/mcp"
    assert canonical("https://mcp.example.com/mcp") != canonical("https://mcp.example.com/other")


def test_the_command_refuses_a_policy_without_oauth_and_oauth_on_stdio(tmp_path: Path) -> None:
    policy = tmp_path / "access.json"
    policy.write_text(json.dumps(POLICY))
    env = toolreg_env("pulsar://127.0.0.1:9", tmp_path)
    cases = [
        (["--http", "127.0.0.1:0", "--policy", str(policy)], "an access policy grants tools to the scopes and claims"),
        (["--oauth-issuer", "http://127.0.0.1:9"], "--oauth-issuer protects --http"),
        (["--http", "127.0.0.1:0", "--rate-limit", "0"], "--rate-limit must be above 0"),
    ]
    for args, says in cases:
        done = toolreg("mcp", *args, env=env, timeout=30)
        assert done.returncode != 0 and says in done.stderr, (args, done.stderr)
    policy.write_text("{nope")
    done = toolreg("mcp", "--http", "127.0.0.1:0", "--policy", str(policy), env=env, timeout=30)
    assert done.returncode != 0 and f"the access policy {policy} is not JSON" in done.stderr

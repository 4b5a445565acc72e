"""The trust and bad-input options of `toolreg up` / `toolreg registry`, and the key commands as
docs/operators.md shows them (rotation included)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from support import toolreg, toolreg_env

from discovery.cli.common import CommandError
from discovery.cli.registry import (
    ALLOWED_NAMESPACES_ENV,
    MAX_CLOCK_SKEW_ENV,
    MAX_INSTANCES_ENV,
    registry_options,
    trust_line,
    write_guard,
)
from discovery.registry.trust import TrustPolicy
from toolservice_base.schemas import ConfigRequest
from toolservice_base.signing import load_private_key, sign_config_request


def args(**values: object) -> argparse.Namespace:
    return argparse.Namespace(**{"trust_policy": None, "allow_namespace": None, "max_clock_skew": None, **values})


def test_flags_win_over_the_environment_which_wins_over_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOWED_NAMESPACES_ENV, raising=False)
    monkeypatch.delenv(MAX_CLOCK_SKEW_ENV, raising=False)
    monkeypatch.delenv(MAX_INSTANCES_ENV, raising=False)
    monkeypatch.delenv("TOOLREG_TRUST_POLICY", raising=False)
    default = registry_options(args())
    assert (
        default.allowed_namespaces == ("tg/request", "tg/response")
        and default.max_clock_skew == 30
        and default.trust is None
    )
    assert default.max_instances == 10_000
    assert "no trust policy" in trust_line(default) and "tg/request, tg/response" in trust_line(default)
    monkeypatch.setenv(ALLOWED_NAMESPACES_ENV, "acme/in, acme/out")
    monkeypatch.setenv(MAX_CLOCK_SKEW_ENV, "5")
    monkeypatch.setenv(MAX_INSTANCES_ENV, "150000")
    from_env = registry_options(args())
    assert (
        from_env.allowed_namespaces == ("acme/in", "acme/out")
        and from_env.max_clock_skew == 5
        and from_env.max_instances == 150_000
    )
    flags = registry_options(args(allow_namespace=["x/y"], max_clock_skew=2.5, max_instances=2))
    assert flags.allowed_namespaces == ("x/y",) and flags.max_clock_skew == 2.5 and flags.max_instances == 2
    assert flags.max_instances_per_service == 2  # one service may still use all of a small cap


@pytest.mark.parametrize(
    ("values", "env", "phrase"),
    [
        ({"allow_namespace": ["tg"]}, {}, "tenant/namespace"),
        ({}, {ALLOWED_NAMESPACES_ENV: "tg/request/extra"}, "tenant/namespace"),
        ({}, {MAX_CLOCK_SKEW_ENV: "soon"}, "not a number"),
        ({"max_clock_skew": -1.0}, {}, "max_clock_skew"),
        ({}, {MAX_INSTANCES_ENV: "lots"}, "not a whole number"),
        ({"max_instances": 0}, {}, "--max-instances must be at least 1"),
        ({"trust_policy": "/nonexistent/trust.json"}, {}, "toolreg trust add"),
    ],
)
def test_a_bad_option_is_one_line(
    values: dict[str, object], env: dict[str, str], phrase: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(CommandError, match=phrase) as caught:
        registry_options(args(**values))
    assert "\n" not in str(caught.value)


def test_toolreg_up_refuses_a_bad_namespace_in_one_line_before_starting_anything(tmp_path: Path) -> None:
    result = toolreg("up", "--allow-namespace", "not-a-namespace", env=toolreg_env("pulsar://127.0.0.1:1", tmp_path))
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "tenant/namespace" in result.stderr, (
        result.stderr
    )
    assert not (tmp_path / "broker.url").exists()


def test_the_documented_rotation_commands_work_as_written(tmp_path: Path) -> None:
    """docs/operators.md, 'Signing keys and rotating them', step by step (without the processes)."""
    env = toolreg_env("pulsar://127.0.0.1:1", tmp_path / "data")
    policy = str(tmp_path / "trust.json")

    def run(*command: str) -> str:
        result = toolreg(*command, env=env)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert "toolreg trust add" in run("keygen", str(tmp_path / "keys/jokes-2026.key"))
    run(
        "trust",
        "add",
        "jokes-2026",
        "--public-key",
        str(tmp_path / "keys/jokes-2026.key.pub"),
        "--services",
        "joke-*",
        "--tools",
        "tell-*",
        "--policy",
        policy,
    )
    run("keygen", str(tmp_path / "keys/jokes-2027.key"))
    added = run(
        "trust",
        "add",
        "jokes-2027",
        "--public-key",
        str(tmp_path / "keys/jokes-2027.key.pub"),
        "--services",
        "joke-*",
        "--tools",
        "tell-*",
        "--policy",
        policy,
    )
    assert added.startswith("added key 'jokes-2027'")
    assert sorted(k.name for k in TrustPolicy.load(policy).keys.values()) == ["jokes-2026", "jokes-2027"]
    listing = run("trust", "list", "--policy", policy)
    assert "jokes-2026" in listing and "jokes-2027" in listing
    run("trust", "remove", "jokes-2026", "--policy", policy)
    assert [k.name for k in TrustPolicy.load(policy).keys.values()] == ["jokes-2027"]
    # the same name again replaces the key (the docs' warning)
    run("keygen", str(tmp_path / "keys/other.key"))
    assert run(
        "trust",
        "add",
        "jokes-2027",
        "--public-key",
        str(tmp_path / "keys/other.key.pub"),
        "--services",
        "joke-*",
        "--tools",
        "tell-*",
        "--policy",
        policy,
    ).startswith("replaced")
    assert len(json.loads(Path(policy).read_text())["keys"]) == 1
    missing = toolreg("trust", "remove", "nobody", "--policy", policy, env=env)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1


def test_an_operator_is_removed_with_remove_operator_and_trust_remove_says_so(tmp_path: Path) -> None:
    """`toolreg trust remove bob` used to say only `no key named 'bob'`, and no command dropped an operator."""
    env = toolreg_env("pulsar://127.0.0.1:1", tmp_path / "data")
    policy = str(tmp_path / "trust.json")
    for name in ("alice", "bob"):
        assert toolreg("keygen", str(tmp_path / f"keys/{name}.key"), env=env).returncode == 0
        pub = str(tmp_path / f"keys/{name}.key.pub")
        assert toolreg("trust", "add-operator", name, "--public-key", pub, "--policy", policy, env=env).returncode == 0
    assert toolreg("trust", "config-writes", "signed", "--policy", policy, env=env).returncode == 0
    wrong = toolreg("trust", "remove", "bob", "--policy", policy, env=env)
    said = [line for line in wrong.stderr.splitlines() if line.startswith("toolreg: ")]
    assert wrong.returncode == 1 and len(said) == 1, wrong.stderr
    assert "no key named 'bob'" in said[0] and "`toolreg trust remove-operator bob`" in said[0], said
    removed = toolreg("trust", "remove-operator", "bob", "--policy", policy, env=env)
    assert removed.returncode == 0 and "removed operator 'bob'" in removed.stdout, removed.stderr
    assert [k.name for k in TrustPolicy.load(policy).operators.values()] == ["alice"]
    bob = load_private_key(tmp_path / "keys/bob.key")
    guard = write_guard(registry_options(args(trust_policy=policy)), None, "tg")
    assert guard is not None
    signed = sign_config_request(ConfigRequest(operation="put", values=[{"type": "tool", "key": "x"}]), bob, "tg")
    assert "not an operator key" in (guard.refusal(signed) or ""), "the store started on the policy refuses bob"
    last = toolreg("trust", "remove-operator", "alice", "--policy", policy, env=env)
    assert last.returncode == 1 and "is the last operator" in last.stderr, last.stderr
    assert toolreg("trust", "remove-operator", "carol", "--policy", policy, env=env).returncode == 1


def test_audit_fronts_are_trusted_listed_and_removed_and_the_registry_counts_callers_from_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = toolreg_env("pulsar://127.0.0.1:1", tmp_path / "data")
    policy = str(tmp_path / "trust.json")
    assert toolreg("keygen", str(tmp_path / "keys/front.key"), env=env).returncode == 0
    pub = str(tmp_path / "keys/front.key.pub")
    assert toolreg("trust", "add-front", "front-eu", "--public-key", pub, "--policy", policy, env=env).returncode == 0
    loaded = TrustPolicy.load(policy)
    assert [k.name for k in loaded.fronts.values()] == ["front-eu"] and loaded.content() == TrustPolicy().content()
    listed = toolreg("trust", "list", "--policy", policy, env=env)
    assert f"audit front front-eu ({next(iter(loaded.fronts))}): its signed audit records are believed" in listed.stdout
    monkeypatch.setenv("TOOLREG_MCP_AUDIT_TOPIC", "1")
    options = registry_options(args(trust_policy=policy))
    assert options.follow_audit and dict(options.audit_fronts) == loaded.front_keys()
    assert "callers counted from the signed audit records of 1 front(s)" in trust_line(options)
    assert "no audit front trusted" in trust_line(registry_options(args()))
    removed = toolreg("trust", "remove-front", "front-eu", "--policy", policy, env=env)
    assert removed.returncode == 0 and "removed audit front 'front-eu'" in removed.stdout, removed.stderr
    assert TrustPolicy.load(policy).fronts == {}

"""`toolreg trust add --workspaces` and `toolreg trust list` saying what each key may do (issue 22, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

from support import toolreg, toolreg_env

from discovery.registry.trust import TrustPolicy


def test_trust_add_takes_workspaces_and_trust_list_says_what_each_key_may_do(tmp_path: Path) -> None:
    env = toolreg_env("pulsar://127.0.0.1:1", tmp_path / "data")
    policy = str(tmp_path / "trust.json")

    def run(*command: str) -> str:
        result = toolreg(*command, env=env)
        assert result.returncode == 0, result.stderr
        return result.stdout

    run("keygen", str(tmp_path / "keys/research.key"))
    run("keygen", str(tmp_path / "keys/jokes.key"))
    added = run(
        "trust",
        "add",
        "research",
        "--public-key",
        str(tmp_path / "keys/research.key.pub"),
        "--services",
        "rs-*",
        "--tools",
        "search*",
        "--workspaces",
        "research",
        "lab-*",
        "--policy",
        policy,
    )
    assert "it may announce services rs-* with tools search* in workspaces research, lab-*" in added
    added = run(
        "trust",
        "add",
        "jokes",
        "--public-key",
        str(tmp_path / "keys/jokes.key.pub"),
        "--services",
        "joke-*",
        "--tools",
        "tell-*",
        "--policy",
        policy,
    )
    assert "in every workspace" in added
    stored = {entry["name"]: entry for entry in json.loads(Path(policy).read_text())["keys"]}
    assert stored["research"]["workspaces"] == ["research", "lab-*"] and "workspaces" not in stored["jokes"]
    assert {k.name: k.workspaces for k in TrustPolicy.load(policy).keys.values()} == {
        "research": ("research", "lab-*"),
        "jokes": ("*",),
    }

    listing = run("trust", "list", "--policy", policy)
    header = listing.splitlines()[0].split()
    assert header == ["NAME", "KEY", "ID", "SERVICES", "TOOLS", "WORKSPACES"]
    assert "research may announce services rs-* with tools search* in workspaces research, lab-*" in listing
    assert "jokes may announce services joke-* with tools tell-* in every workspace" in listing
    listed = {key["name"]: key for key in json.loads(run("trust", "list", "--json", "--policy", policy))}
    assert listed["research"]["workspaces"] == ["research", "lab-*"] and listed["jokes"]["workspaces"] == ["*"]
    assert listed["research"]["may"] == "announce services rs-* with tools search* in workspaces research, lab-*"


def test_a_bad_workspace_pattern_is_one_line(tmp_path: Path) -> None:
    env = toolreg_env("pulsar://127.0.0.1:1", tmp_path / "data")
    toolreg("keygen", str(tmp_path / "k.key"), env=env)
    result = toolreg(
        "trust",
        "add",
        "x",
        "--public-key",
        str(tmp_path / "k.key.pub"),
        "--services",
        "s",
        "--tools",
        "t",
        "--workspaces",
        "not a name",
        "--policy",
        str(tmp_path / "trust.json"),
        env=env,
    )
    assert (
        result.returncode != 0
        and "'workspaces' must be a non-empty list" in result.stderr
        and result.stderr.count("\n") == 1
    ), result.stderr
    assert not (tmp_path / "trust.json").exists()

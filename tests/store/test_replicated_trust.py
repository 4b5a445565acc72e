"""Replicas started with a trust policy, as the operators' guide shows, form one group.

Every replica publishes a digest of what must be alike across the group (the
trust policy among it), and a standby compares its own with the active's. The
digest is of the policy's content (each key's public key and scopes, the
policy's settings), so two processes reading one policy file agree, and a
policy that decides otherwise differs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import eventually
from support.replicas import Cluster

from discovery.registry.trust import TrustPolicy, trusted_key
from toolservice_base.signing import generate_key_pair

DIGEST = """
import argparse, sys
from discovery.cli import registry
from discovery.cli.up import shared_options
from discovery.replicas import settings_digest
args = argparse.Namespace(trust_policy=sys.argv[1])
print(settings_digest(shared_options(registry.registry_options(args))))
"""


def policy(tmp_path: Path, name: str, tools: list[str]) -> Path:
    private, public = generate_key_pair(tmp_path / f"{name}.key")
    held = TrustPolicy(path=tmp_path / f"{name}.json")
    held.add(trusted_key("jokes", public.read_text().strip(), ["joke-*"], tools))
    return held.save()


def digest_in_a_process_of_its_own(path: Path) -> str:
    done = subprocess.run([sys.executable, "-c", DIGEST, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_settings_digest_of_one_policy_is_the_same_in_every_process_and_another_policys_differs(
    tmp_path: Path,
) -> None:
    path = policy(tmp_path, "one", ["tell-*"])
    first, second = digest_in_a_process_of_its_own(path), digest_in_a_process_of_its_own(path)
    assert first == second and len(first) == 12
    reordered = json.loads(path.read_text())
    reordered["keys"][0]["public-key"] = "  " + reordered["keys"][0]["public-key"] + "\n"  # the same key, spelt apart
    reordered["keys"][0]["name"] = "renamed"  # a name decides nothing
    (tmp_path / "same.json").write_text(json.dumps(reordered))
    assert digest_in_a_process_of_its_own(tmp_path / "same.json") == first
    wider = json.loads(path.read_text())
    wider["keys"][0]["tools"] = ["*"]
    (tmp_path / "wider.json").write_text(json.dumps(wider))
    assert digest_in_a_process_of_its_own(tmp_path / "wider.json") != first


@pytest.mark.apache_pulsar
@pytest.mark.timeout(180)
async def test_replicas_started_with_a_trust_policy_as_the_guide_shows_form_one_group(
    cluster: Cluster, tmp_path: Path
) -> None:
    path = policy(tmp_path, "trust", ["tell-*"])
    await cluster.start("a", "--trust-policy", str(path))
    await cluster.start("b", "--trust-policy", str(path))
    rows = await eventually(lambda: cluster.replicas(), timeout=30)
    assert sorted(row["role"] for row in rows) == ["active", "standby"], rows
    assert all(cluster.processes[name].poll() is None for name in ("a", "b"))
    assert "config.replica_settings_differ" not in cluster.output("a") + cluster.output("b")

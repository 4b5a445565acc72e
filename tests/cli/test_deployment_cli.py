"""`toolreg call` never talks to the wrong deployment, and says so when its tools come from a snapshot.

The data directory (`./.toolreg` unless told) is shared by every command run from one directory, whatever
broker and topicspace each is aimed at. A call aimed at a topicspace where no store answers must fail, not be
answered by another deployment's service through its snapshot; a call served from its own deployment's snapshot
says which snapshot, how old, and of which deployment, in a line a person reads (not only a JSON log event).
"""

from __future__ import annotations

from pathlib import Path

from support import atoolreg, static_items, toolreg_env

from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, DynamicToolService, Settings


async def test_a_call_aimed_at_another_topicspace_fails_instead_of_being_served_from_this_ones_snapshot(
    tmp_path: Path,
    settings: Settings,
    config_client: ConfigClient,
    config_store: ConfigStoreService,
    running: dict[str, DynamicToolService],
) -> None:
    await config_client.put(static_items(running["joke-service"]))
    env = toolreg_env(settings.pulsar_url or "", tmp_path / "cli")
    first = await atoolreg("call", "tell-joke", "topic=cats", env=env)
    assert first.returncode == 0 and "cats" in first.stdout, first.stderr
    await config_store.stop()

    offline = await atoolreg("call", "tell-joke", "topic=cats", "--timeout", "1", env=env)
    assert offline.returncode == 0 and "cats" in offline.stdout, offline.stderr
    warning = [line for line in offline.stderr.splitlines() if line.startswith("toolreg: warning:")]
    assert len(warning) == 1, offline.stderr
    assert "the config store did not answer within 1s; the tools come from the snapshot" in warning[0]
    assert str(tmp_path / "cli" / "bridge-snapshot-default.tg.") in warning[0]
    assert f"(topicspace tg on {settings.pulsar_url}), taken" in warning[0] and "s ago" in warning[0]

    for aimed in (
        atoolreg("--topicspace", "nosuch", "call", "tell-joke", "topic=cats", "--timeout", "1", env=env),
        atoolreg("call", "tell-joke", "topic=cats", "--timeout", "1", env={**env, "TOOLREG_TOPICSPACE": "nosuch"}),
    ):
        refused = await aimed
        assert refused.returncode == 1 and refused.stdout == "", refused.stdout
        line = refused.stderr.strip().splitlines()[-1]
        assert line.startswith("toolreg: ") and "topicspace nosuch" in line, refused.stderr
        assert "not used, being of another deployment" in line and "--static-dir" in line


async def test_a_long_option_is_never_taken_for_another_by_its_prefix(
    tmp_path: Path,
    settings: Settings,
    config_client: ConfigClient,
    running: dict[str, DynamicToolService],
) -> None:
    """`--topic cats` was read as `--topicspace cats`: now it is refused, saying how tool arguments are written."""
    await config_client.put(static_items(running["joke-service"]))
    env = toolreg_env(settings.pulsar_url or "", tmp_path / "cli")
    result = await atoolreg("call", "tell-joke", "--topic", "cats", env=env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("usage: toolreg call "), result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "toolreg call: error: unrecognized arguments: --topic cats; "
        "a tool's arguments are KEY=VALUE, not options: topic=cats"
    )

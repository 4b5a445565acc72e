"""`toolreg tools --search QUERY`: the store's tools, best match first, ranked by the registry's view of them too."""

from __future__ import annotations

import json
from pathlib import Path

from support import atoolreg, toolreg_env
from support.corpus import corpus_items

from discovery.broker import EmbeddedBroker
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient

ORPHAN = (
    "tool",
    "jira.ticket.archive-orphan",
    json.dumps(
        {
            "type": "tool-service",
            "name": "jira.ticket.archive-orphan",
            "service": "gone",
            "description": "Archive a ticket in Jira issue tracker (its service is gone)",
        }
    ),
)


async def test_the_best_matches_first_and_an_unavailable_tool_left_out(
    broker: EmbeddedBroker, tmp_path: Path, registry: Registry, config_client: ConfigClient
) -> None:
    await config_client.put([*corpus_items(), ORPHAN])
    env = toolreg_env(broker.url, tmp_path)
    done = await atoolreg("tools", "--search", "archive a ticket in jira", "--limit", "3", "--json", env=env)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert [f["name"] for f in found][0] == "jira.ticket.archive" and len(found) == 3
    assert all(f["status"] == "configured" for f in found)  # the registry's word for a static tool
    assert "jira.ticket.archive-orphan" not in [f["name"] for f in found]  # unavailable: never returned

    table = await atoolreg("tools", "--search", "archive a ticket in jira", "--limit", "2", env=env)
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["TOOL", "SCORE", "STATUS", "SERVICE", "DESCRIPTION"]
    assert lines[1].startswith("jira.ticket.archive ") and len(lines) == 3


async def test_bad_queries_are_one_line_and_a_silent_registry_is_said(
    broker: EmbeddedBroker, tmp_path: Path, config_store: ConfigStoreService, config_client: ConfigClient
) -> None:
    await config_client.put(corpus_items())
    env = toolreg_env(broker.url, tmp_path)
    for args, message in (
        (["--search", " the "], "no words to search for"),
        (["--search", "x" * 10_240], "10,240 characters long"),
        (["--search", "ticket", "--limit", "0"], "limit must be a whole number from 1 to 100"),
        (["--search", "ticket", "--limit", "10000"], "limit must be a whole number from 1 to 100"),
    ):
        done = await atoolreg("tools", *args, "--timeout", "2", env=env)
        assert done.returncode == 1 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, args
    # No registry running: ranked by text alone, and stderr says so.
    done = await atoolreg("tools", "--search", "wetter für München 🌦 forecast", "--timeout", "2", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert "the registry did not answer" in done.stderr
    assert json.loads(done.stdout)[0]["name"].startswith("weather.forecast")

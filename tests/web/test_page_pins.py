"""The registry page of a registry that pins definitions, runs replicated, and says which one it is.

Server-rendered here (and against a real registry on a real broker); the same
page through page.js in a browser is tests/web/test_page_browser.py.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from support import eventually
from support.pins import ORIGINAL, PINNING, Sender, announce, service, tool

from discovery.registry.overview import (
    RegistryIdentity,
    RegistrySnapshot,
    ReplicaView,
    ToolView,
    TrustView,
    trust_view,
)
from discovery.registry.protocol import PendingChange, Rejection
from discovery.registry.service import Registry
from discovery.registry.trust import TrustPolicy
from discovery.store.service import ConfigStoreService
from discovery.web.health import HealthServer
from discovery.web.page import PageAccess, PageFeed, page_routes, render
from toolservice_base import Transport
from toolservice_base.schemas import Announcement, descriptor_digest
from toolservice_base.schemas.tools import definition_digest

HOSTILE = '<script>document.title="owned"</script><img src=x onerror="alert(1)">'
PINNED = "a" * 64
OFFERED = "b" * 64
DIFF = (
    f'--- pinned {PINNED[:12]}\n+++ offered {OFFERED[:12]}\n@@ -1,3 +1,3 @@\n-  "description": "Tell a joke",\n+ '
    f' "description": "{HOSTILE}",'
)


class Stub:
    """A `SnapshotSource` whose next snapshot the test sets."""

    def __init__(self, snapshot: RegistrySnapshot) -> None:
        self.value = snapshot

    async def snapshot(self) -> RegistrySnapshot:
        return self.value


def change(last_seen: float = 1000.0, **fields: Any) -> PendingChange:
    values: dict[str, Any] = {
        "tool": "tell-joke",
        "service": "jokes",
        "workspace": "default",
        "pinned": PINNED,
        "offered": OFFERED,
        "diff": DIFF,
        "signer": "jokes-team",
        "version": "2.0",
        "pinned_version": "1.0",
        "first_seen": 900.0,
        "last_seen": last_seen,
    }
    return PendingChange(**{**values, **fields})


def pinned_snapshot(at: float = 1000.0, last_seen: float = 1000.0, **fields: Any) -> RegistrySnapshot:
    values: dict[str, Any] = {
        "at": at,
        "config_version": 4,
        "held": [],
        "instances": [],
        "rejections": [],
        "rejected_total": 0,
        "conflicts": [],
        "tools": [
            ToolView(
                name="tell-joke",
                service="jokes",
                workspace="default",
                source="announced",
                status="live",
                instances=1,
                description="Tell a joke",
                digest=PINNED,
            )
        ],
        "pinning": True,
        "pending": [change(last_seen)],
    }
    return RegistrySnapshot(**{**values, **fields})


def section(html: str, table: str) -> str:
    """The HTML of one table's section."""
    found = re.search(rf'<section id="{table}-section"[^>]*>.*?</section>', html, re.S)
    assert found is not None, table
    return found.group(0)


def test_the_pending_table_and_the_digest_column_render_server_side_with_the_diff_escaped() -> None:
    html = render(pinned_snapshot())
    tools = section(html, "tools")
    assert "<th>Digest</th>" in tools
    assert f'<td class="mono digest" title="{PINNED}">{PINNED[:12]}</td>' in tools, (
        "12 hex digits, the whole digest in the title"
    )
    pending = section(html, "pending")
    assert pending.startswith('<section id="pending-section">'), "shown while the registry pins"
    headers = re.findall(r"<th>(.*?)</th>", pending)
    assert headers == [
        "Tool",
        "Service",
        "Workspace",
        "Pinned",
        "Offered",
        "Version",
        "Signer",
        "First seen",
        "Last seen",
        "Diff",
    ]
    assert (
        f'title="{PINNED}">{PINNED[:12]}</td><td class="mono digest" title="{OFFERED}">{OFFERED[:12]}</td>' in pending
    )
    assert "<td>1.0 → 2.0</td><td>jokes-team</td><td>2 min ago</td>" in pending, (
        "versions pinned → offered, signer, first seen"
    )
    assert '<td data-pending="default/tell-joke">0.0 s ago</td>' in pending
    assert (
        '<details><summary>diff</summary><pre class="diff">--- pinned aaaaaaaaaaaa\n+++ offered bbbbbbbbbbbb\n'
        in pending
    )
    # The diff is the offered definition's text: it came from the network, and it is escaped like everything else.
    assert "<script>document" not in html and "<img src=x" not in html
    assert (
        "&lt;script&gt;document.title=&#34;owned&#34;&lt;/script&gt;&lt;img src=x onerror=&#34;alert(1)&#34;&gt;"
        in pending
    )
    assert html.count("<script") == 1, "only page.js"
    assert re.search(r'<span id="footer-pending">, <code>toolreg pending</code>', html), "the footer names the command"
    assert re.search(r'<span id="pinning-note">definitions pinned', html)


def test_without_pinning_the_pending_table_is_hidden_and_nothing_mentions_it() -> None:
    html = render(pinned_snapshot(pinning=False, pending=[]))
    assert section(html, "pending").startswith('<section id="pending-section" hidden>')
    assert '<span id="footer-pending" hidden>' in html and '<span id="pinning-note" hidden>' in html
    assert '<td class="mono digest" title="' in section(html, "tools"), (
        "the digest column stays: `toolreg tools` shows it too"
    )


def test_the_replicas_table_shows_only_when_the_registry_runs_replicated() -> None:
    at = 1000.0
    replicas = [
        ReplicaView(id="r-active", group="registry", role="active", pid=4242, host="box-1", version=17, since=at - 90),
        ReplicaView(id="r-standby", group="registry", role="standby", pid=77, host=HOSTILE, version=16, since=at - 5),
    ]
    html = render(pinned_snapshot(at=at, replicas=replicas))
    table = section(html, "replicas")
    assert table.startswith('<section id="replicas-section">')
    assert re.findall(r"<th>(.*?)</th>", table) == [
        "Replica",
        "Group",
        "Role",
        "PID",
        "Host",
        "Version applied",
        "Since",
    ]
    assert (
        '<tr><td class="id">r-active</td><td>registry</td><td class="role-active">active</td><td>4242</td>'
        '<td class="mono">box-1</td><td>17</td><td>2 min ago</td></tr>' in table
    )
    assert "<script>document" not in table and '<td class="role-standby">standby</td>' in table
    assert '<span id="footer-replicas">, <code>toolreg replicas</code></span>' in html
    alone = render(pinned_snapshot(at=at))
    assert (
        section(alone, "replicas").startswith('<section id="replicas-section" hidden>')
        and '<span id="footer-replicas" hidden>' in alone
    )


def test_the_header_says_which_registry_it_is_whether_it_checks_signatures_and_links_health() -> None:
    at = 10_000.0
    snapshot = pinned_snapshot(
        at=at,
        identity=RegistryIdentity(broker="pulsar://broker.internal:6650", topicspace="tg-prod", host="registry-0"),
        started=at - 7200,
        trust=TrustView(policy="/etc/toolreg/trust.json", keys=3, auto_approve="same-key-higher-version"),
        rejections=[
            Rejection(
                at=at - 4, reason="unsigned announcement", service="rogue", instance="rogue-1", count=12, first=at - 600
            )
        ],
        rejected_total=12,
    )
    html = render(snapshot)
    assert (
        '<code id="broker">pulsar://broker.internal:6650</code>' in html
        and '<code id="topicspace">tg-prod</code>' in html
    )
    assert '<code id="host">registry-0</code>' in html and '<span id="uptime">2.0 h</span>' in html
    assert (
        "trust policy <code>/etc/toolreg/trust.json</code>: 3 keys; only their signed announcements are accepted"
        in html
    )
    assert "(auto-approve: same-key-higher-version)" in html
    assert '<a href="metrics">/metrics</a>' in html and '<a href="readyz">/readyz</a>' in html
    rejections = section(html, "rejections")
    assert re.findall(r"<th>(.*?)</th>", rejections) == ["Last", "Times", "First", "Service", "Instance", "Reason"]
    assert '<tr><td>4.0 s ago</td><td>12</td><td>10 min ago</td><td class="mono">rogue</td>' in rejections
    assert '<input id="filter" type="search"' in html and 'autocomplete="off" hidden>' in html, (
        "the filter needs page.js"
    )

    open_door = render(pinned_snapshot(trust=trust_view(None)))
    assert (
        '<span id="trust" class="warn">no trust policy: every valid announcement is accepted, signed or not</span>'
        in open_door
    )
    unknown = render(pinned_snapshot(pinning=False, pending=[]))
    assert '<p id="trust-line" hidden>' in unknown and '<span id="uptime-part" hidden>' in unknown, (
        "what is not known is not claimed"
    )


def test_trust_view_reads_a_policy_as_the_trust_line_does(tmp_path: Any) -> None:
    policy = TrustPolicy(path=tmp_path / "trust.json", auto_approve="same-key-higher-version")
    assert trust_view(policy) == TrustView(
        policy=str(tmp_path / "trust.json"), keys=0, auto_approve="same-key-higher-version"
    )
    assert trust_view(TrustPolicy()).policy == "(in memory)" and trust_view(None) == TrustView()


async def test_heartbeats_of_an_instance_offering_a_held_definition_are_no_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("discovery.web.feed.BEATS_INTERVAL", 0.0)
    stub = Stub(pinned_snapshot(at=1000.0, last_seen=1000.0))
    feed = PageFeed(stub)
    await feed.refresh()
    assert feed.snapshots == 1
    for n in range(1, 6):  # the held offer's instance heartbeats: only its last-heard time moves
        stub.value = pinned_snapshot(at=1000.0 + n, last_seen=1000.0 + n)
        await feed.refresh()
    assert feed.snapshots == 1, "a heartbeat of a pending instance pushed a whole snapshot"
    assert feed.beats_sent == 5
    beats = json.loads(feed.beats.split(b"data: ", 1)[1])
    assert beats == {"at": 1005.0, "last_seen": {}, "pending": {"default/tell-joke": 1005.0}}
    stub.value = pinned_snapshot(
        at=1006.0, last_seen=1006.0, pending=[change(1006.0, offered="c" * 64)]
    )  # another offer: a change
    await feed.refresh()
    assert feed.snapshots == 2


# --- against a real registry that pins -------------------------------------------------------


def get(url: str) -> tuple[int, str]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        connection.request("GET", parts.path or "/")
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


@pytest.fixture
async def pinning(connection: Transport, config_store: ConfigStoreService) -> AsyncIterator[Registry]:
    registry = Registry(connection, options=PINNING)
    await registry.start()
    yield registry
    await registry.stop()


def heartbeat(instance: str, sequence: int, digest: str) -> Announcement:
    return Announcement(
        kind="heartbeat",
        instance=instance,
        sequence=sequence,
        sent_at=time.time(),
        ttl=30.0,
        workspace="default",
        digest=digest,
    )


async def test_a_held_definition_shows_on_the_page_and_its_heartbeats_push_no_frames(
    pinning: Registry, connection: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("discovery.web.feed.BEATS_INTERVAL", 0.0)
    feed = PageFeed(pinning.overview)
    send = Sender(connection)
    try:
        async with HealthServer(port=0) as health:
            health.add_routes(page_routes(pinning.overview, PageAccess(True, None), health.closing, feed=feed))
            await send(announce(service(), ORIGINAL, instance="jokes-1"))
            pinned = definition_digest(ORIGINAL, service())

            async def pinned_and_listed() -> bool:
                return [(t.name, t.digest) for t in (await feed.refresh()).tools] == [("tell-joke", pinned)]

            await eventually(pinned_and_listed, timeout=5)
            changed = tool(description=f"Tell a joke. {HOSTILE}")
            offered = definition_digest(changed, service())
            await send(announce(service(), changed, instance="jokes-2", version="2.0"))

            async def held() -> list[PendingChange]:
                return (await feed.refresh()).pending

            pending = await eventually(held, timeout=5)
            assert [(p.tool, p.pinned, p.offered, p.version) for p in pending] == [
                ("tell-joke", pinned, offered, "2.0")
            ]
            await pinning.settle()
            status, html = await asyncio.to_thread(get, f"{health.url}/")
            assert status == 200
            table = section(html, "pending")
            assert f'title="{offered}">{offered[:12]}</td>' in table and "<script>document" not in html
            assert "&lt;script&gt;document.title=" in table, "the offered description, escaped, in the diff"
            assert f'title="{pinned}">{pinned[:12]}</td>' in section(html, "tools")
            snapshot = json.loads((await asyncio.to_thread(get, f"{health.url}/snapshot.json"))[1])
            assert snapshot["pinning"] is True and snapshot["identity"]["broker"] == connection.url
            assert snapshot["identity"]["topicspace"] == connection.topics.topicspace and snapshot["identity"]["host"]
            assert snapshot["started"] <= snapshot["at"]

            await asyncio.sleep(0.5)
            await feed.refresh()  # settled: what the page has now is the baseline
            frames, beats, first_seen = feed.snapshots, feed.beats_sent, pending[0].last_seen
            digest = descriptor_digest(service(), [changed])
            for sequence in range(2, 7):
                await send(heartbeat("jokes-2", sequence, digest))
                await asyncio.sleep(0.15)
                await feed.refresh()
            assert feed.latest is not None and feed.latest.pending[0].last_seen > first_seen, (
                "the heartbeats were heard"
            )
            assert feed.snapshots == frames, "heartbeats of the instance offering a held definition pushed snapshots"
            assert feed.beats_sent > beats
            sent = json.loads(feed.beats.split(b"data: ", 1)[1])
            assert sent["pending"]["default/tell-joke"] == feed.latest.pending[0].last_seen
    finally:
        if send.publisher is not None:
            await connection.close_publisher(send.publisher)

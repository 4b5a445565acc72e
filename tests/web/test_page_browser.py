"""The registry page in a real browser: headless Chromium (Debian's `chromium` package) driven by Playwright.

`toolreg up --metrics-port 0 --trust-policy ...` runs as a user would run it.
With the page open (and never reloaded), a signed service starts and its row
appears, an unsigned announcement is refused and shows under rejections, a
tool whose description holds `<script>` shows it as text, and the service is
killed and its row goes. A search typed in the box is ranked on the server and
keeps its query and order as the page redraws itself; with JavaScript off it is
a plain GET form. The screenshot taken on the way is the one the README
shows (docs/registry-page.png), so it is rewritten by every run; writing it is
best effort and never fails the test.

Playwright is only the driver: it launches the system's Chromium by path and
never downloads a browser. `.ci/run` installs Debian's `chromium` where it is
missing; without it this test fails and says so.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from subprocess import Popen
from urllib.parse import quote

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect
from support import eventually, toolreg_background, toolreg_env
from support.registry import offering
from test_page import acall

from discovery.broker import EmbeddedBroker
from discovery.registry.overview import (
    InstanceView,
    RegistryIdentity,
    RegistrySnapshot,
    ReplicaView,
    ToolView,
    TrustView,
)
from discovery.registry.protocol import PendingChange, Rejection
from discovery.registry.service import Registry
from discovery.registry.trust import TrustPolicy, trusted_key
from discovery.registry.usage import ToolUsage
from discovery.web.health import HealthServer
from discovery.web.page import PageAccess, PageFeed, page_routes, serve_registry_page
from toolservice_base import Transport
from toolservice_base.signing import generate_key_pair

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "registry-page.png"
HOSTILE = '<script>window.owned = true; document.title = "owned"</script>Search the team\'s <b>notes</b>'


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "Debian's chromium is not installed: `apt-get install -y chromium` (.ci/run does it); Playwright never"
            " downloads one"
        )
    return found


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium_path(), headless=True)
        yield launched
        await launched.close()


class Stack:
    """The processes of one test, each logging to its own file; all stopped at the end."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, env
        self.procs: dict[str, Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> Path:
        log = self.tmp / f"{name}.log"
        self.procs[name] = toolreg_background(*args, env=self.env, log=log)
        return log

    def stop(self) -> None:
        for proc in reversed(self.procs.values()):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            proc.wait(timeout=20)


@pytest.fixture
def stack(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Stack]:
    running = Stack(tmp_path, toolreg_env(broker.url, tmp_path / "data"))
    yield running
    running.stop()


def log_line(log: Path, marker: str) -> str | None:
    return next((line for line in log.read_text().splitlines() if marker in line), None)


def save_screenshot(image: bytes) -> None:
    """Refresh the README's screenshot, best effort: the page's behaviour is what this test checks, not the file.

    Only a plausible PNG replaces the old one, and atomically (a run cut short
    leaves the previous picture); a docs/ that cannot be written is a warning.
    """
    if not image.startswith(b"\x89PNG") or len(image) < 10_000:
        warnings.warn(
            f"the page's screenshot is not a plausible PNG ({len(image)} bytes); {SCREENSHOT.name} left as it was",
            stacklevel=2,
        )
        return
    try:
        partial = SCREENSHOT.with_suffix(".png.partial")
        partial.write_bytes(image)
        partial.replace(SCREENSHOT)
    except OSError as exc:
        warnings.warn(f"could not refresh {SCREENSHOT}: {exc}", stacklevel=2)


def write_json(path: Path, value: object) -> str:
    path.write_text(json.dumps(value))
    return str(path)


async def test_the_registry_page_follows_services_live_in_a_browser(
    browser: Browser, stack: Stack, tmp_path: Path
) -> None:
    jokes_key, jokes_pub = generate_key_pair(tmp_path / "jokes")
    notes_key, notes_pub = generate_key_pair(tmp_path / "notes")
    policy = TrustPolicy(path=tmp_path / "trust.json")
    policy.add(trusted_key("jokes-team", jokes_pub.read_text(), ["joke-*"], ["tell-*"]))
    policy.add(trusted_key("notes-team", notes_pub.read_text(), ["notes-*"], ["find-*"]))
    policy.save()

    up_log = stack.start("up", "up", "--metrics-port", "0", "--trust-policy", str(policy.path))
    line = await eventually(lambda: log_line(up_log, "page          http"), timeout=30)
    url = line.split()[-1]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/")

    page: Page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await page.goto(url)
    await expect(page.locator("#live")).to_have_text("live", timeout=5000)
    await page.evaluate("window.sameDocument = true")
    tools = page.locator("#tools tbody")
    await expect(tools).to_contain_text("no tools")

    # A signed service starts: its row appears within 2 s of its announcement, without a reload.
    serve_log = stack.start(
        "joke", "serve", "toolservice_base.examples.joke:JokeService", "--ttl", "1.5", "--signing-key", str(jokes_key)
    )
    await eventually(lambda: log_line(serve_log, '"service.announced"'), timeout=30)
    announced = time.monotonic()
    joke_row = tools.locator("tr", has_text="tell-joke")
    await expect(joke_row).to_have_count(1, timeout=2000)
    assert time.monotonic() - announced < 2.0
    instance = json.loads(log_line(serve_log, '"service.announced"') or "{}")["instance"]
    instance_row = page.locator("#instances tbody tr", has_text=instance)
    await expect(instance_row.locator("td").nth(3)).to_have_text("jokes-team")  # the signer, by its name in the policy
    await expect(instance_row.locator("td").nth(2)).to_have_text("1.0")
    assert await instance_row.locator("meter").get_attribute("max") == "1.5"
    # Heartbeats are no change to the tables: they come as small `heartbeats` events, and the bar follows them.
    heard = await instance_row.locator("meter").get_attribute("data-last-seen")
    await expect(instance_row.locator("meter")).not_to_have_attribute("data-last-seen", heard or "", timeout=3000)

    # An unsigned announcement is refused, and shows under rejections.
    rogue = tmp_path / "rogue"
    rogue.mkdir()
    stack.start(
        "rogue",
        "announce",
        "--service",
        write_json(rogue / "service.json", {"id": "rogue-service"}),
        "--tools",
        write_json(rogue / "tools.json", [{"name": "rogue-tool", "description": "Anything"}]),
    )
    rejection = page.locator("#rejections tbody tr", has_text="rogue-service").first
    await expect(rejection).to_contain_text("unsigned announcement", timeout=15000)

    # A description holding markup is shown as text: no script runs, no element is made.
    notes = tmp_path / "notes-offer"
    notes.mkdir()
    stack.start(
        "notes",
        "announce",
        "--service",
        write_json(notes / "service.json", {"id": "notes-service"}),
        "--tools",
        write_json(
            notes / "tools.json",
            [
                {
                    "name": "find-notes",
                    "description": HOSTILE,
                    "arguments": [{"name": "query", "type": "string", "description": "What to look for"}],
                }
            ],
        ),
        "--signing-key",
        str(notes_key),
        "--service-version",
        "2.4.1",
    )
    description = tools.locator("tr", has_text="find-notes").locator("td.description")
    await expect(description).to_have_text(HOSTILE, timeout=15000)
    assert await description.locator("b, script").count() == 0
    assert await page.evaluate("window.owned === undefined") and await page.title() == "toolreg registry"

    await page.wait_for_timeout(600)  # let the bars move off zero
    save_screenshot(await page.screenshot(full_page=True))

    # The service is killed (no withdraw): its row goes when its lease runs out, still without a reload.
    stack.procs["joke"].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    await expect(joke_row).to_have_count(0, timeout=5000)
    assert time.monotonic() - killed < 1.5 + 2.0, "gone within its ttl and two seconds"
    await expect(page.locator("#instances tbody tr", has_text=instance)).to_have_count(0)
    assert await page.evaluate("window.sameDocument === true"), "the page was never reloaded"

    # With JavaScript off the same page is a plain, complete table.
    static = await browser.new_context(java_script_enabled=False)
    try:
        plain = await static.new_page()
        await plain.goto(url)
        await expect(plain.locator("#live")).to_have_text("static page: reload for the latest")
        await expect(plain.locator("#tools tbody tr", has_text="find-notes").locator("td.description")).to_have_text(
            HOSTILE
        )
        await expect(plain.locator("#rejections tbody")).to_contain_text("unsigned announcement")
    finally:
        await static.close()


# --- pinned definitions, replicas, the header and the filter, through page.js -----------------------------


class Stub:
    """A `SnapshotSource` whose next snapshot the test sets: the page's feed picks it up within a tick."""

    def __init__(self, snapshot: RegistrySnapshot) -> None:
        self.value = snapshot

    async def snapshot(self) -> RegistrySnapshot:
        return self.value


PINNED, OFFERED = "a" * 64, "b" * 64
DIFF = (
    f'--- pinned {PINNED[:12]}\n+++ offered {OFFERED[:12]}\n-  "description": "Tell a joke",\n+  "description":'
    f' "{HOSTILE}",'
)


def pinned_registry(base: float, at: float, last_seen: float, tools: int = 3) -> RegistrySnapshot:
    """A registry at `at` whose events happened around `base`: only `at`, `last_seen` and `tools` vary between calls."""
    names = ["tell-joke", "find-notes", "calculate", "echo", "countdown"][:tools]
    return RegistrySnapshot(
        at=at,
        config_version=9,
        held=[],
        instances=[],
        conflicts=[],
        rejected_total=1,
        rejections=[
            Rejection(
                at=base - 3,
                reason="unsigned announcement",
                service="rogue",
                instance="rogue-1",
                count=4,
                first=base - 300,
            )
        ],
        tools=[
            ToolView(
                name=name,
                service=f"{name}-svc",
                workspace="default",
                source="announced",
                status="live",
                instances=1,
                description=f"The {name} tool",
                digest=(PINNED if name == "tell-joke" else name.encode().hex().ljust(64, "0")),
            )
            for name in names
        ],
        pinning=True,
        pending=[
            PendingChange(
                tool="tell-joke",
                service="tell-joke-svc",
                workspace="default",
                pinned=PINNED,
                offered=OFFERED,
                diff=DIFF,
                signer="jokes-team",
                version="2.0",
                pinned_version="1.0",
                first_seen=base - 120,
                last_seen=last_seen,
            )
        ],
        replicas=[
            ReplicaView(
                id="replica-a", group="registry", role="active", pid=101, host="box-1", version=9, since=base - 60
            ),
            ReplicaView(
                id="replica-b", group="registry", role="standby", pid=202, host="box-2", version=9, since=base - 30
            ),
        ],
        identity=RegistryIdentity(broker="pulsar://broker.example:6650", topicspace="tg-prod", host="box-1"),
        started=base - 3600,
        trust=TrustView(policy="/etc/toolreg/trust.json", keys=2),
    )


@asynccontextmanager
async def served_page(browser: Browser, stub: Stub) -> AsyncIterator[tuple[Page, PageFeed]]:
    """The page of `stub`'s registry, open and live in the browser, with the feed that counts its frames."""
    feed = PageFeed(stub)
    async with HealthServer(port=0) as health:
        health.add_routes(page_routes(stub, PageAccess(True, None), health.closing, feed=feed))
        page: Page = await browser.new_page(viewport={"width": 1280, "height": 900})
        await page.goto(f"{health.url}/")
        await expect(page.locator("#live")).to_have_text("live", timeout=5000)
        yield page, feed


async def test_pending_changes_replicas_and_the_filter_in_a_browser(
    browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("discovery.web.feed.BEATS_INTERVAL", 0.0)
    now = time.time()
    stub = Stub(pinned_registry(now, now, now - 1))
    async with served_page(browser, stub) as (page, feed):
        frames = feed.snapshots

        # The header: which registry, its trust policy, how long it has run; links to health and metrics.
        await expect(page.locator("#broker")).to_have_text("pulsar://broker.example:6650")
        await expect(page.locator("#topicspace")).to_have_text("tg-prod")
        await expect(page.locator("#uptime")).to_have_text(re.compile(r"^1\.0 h$"))
        await expect(page.locator("#trust")).to_contain_text("trust policy /etc/toolreg/trust.json: 2 keys")
        assert (
            await page.locator('a[href="metrics"]').count() >= 1 and await page.locator('a[href="readyz"]').count() >= 1
        )

        # Digests: 12 digits, the whole one in the title.
        digest = page.locator("#tools tbody tr", has_text="tell-joke").locator("td.digest")
        await expect(digest).to_have_text(PINNED[:12])
        assert await digest.get_attribute("title") == PINNED

        # The held change, its diff as text (a hostile description makes no element and runs nothing).
        row = page.locator("#pending tbody tr", has_text="tell-joke")
        await expect(row).to_have_count(1)
        await expect(row.locator("td").nth(3)).to_have_text(PINNED[:12])
        await expect(row.locator("td").nth(4)).to_have_text(OFFERED[:12])
        await expect(row.locator("td").nth(5)).to_have_text("1.0 → 2.0")
        await expect(row.locator("td").nth(7)).to_have_text(re.compile(r"^2 min ago$"))
        diff = row.locator("pre.diff")
        assert await diff.text_content() == DIFF
        assert await diff.locator("*").count() == 0 and await page.evaluate("window.owned === undefined")
        assert await page.title() == "toolreg registry"
        await row.locator("summary").click()
        await expect(diff).to_be_visible()
        await expect(page.locator("#footer-pending")).to_be_visible()
        await expect(page.locator("#rejections tbody tr").first.locator("td").nth(1)).to_have_text("4")

        # Replicas.
        await expect(page.locator("#replicas-section")).to_be_visible()
        await expect(page.locator("#replicas tbody tr", has_text="replica-a").locator("td.role-active")).to_have_text(
            "active"
        )

        # The instance offering the held change heartbeats: its last-seen moves, no snapshot is sent, the diff stays
        # open.
        last = row.locator("td[data-pending]")
        await expect(last).to_have_text(re.compile(r"^[12]\.\d s ago$"))
        stub.value = pinned_registry(now, time.time(), time.time())
        await expect(last).to_have_text(re.compile(r"^0\.\d s ago$"), timeout=3000)
        assert feed.snapshots == frames, "a heartbeat of a pending instance sent a snapshot"

        # A real change redraws the tables, and the diff being read stays open.
        stub.value = pinned_registry(now, time.time(), time.time(), tools=5)
        await expect(page.locator("#tools tbody tr")).to_have_count(5, timeout=3000)
        await expect(page.locator("#pending pre.diff")).to_be_visible()

        # The filter: every table's rows that hold the text, the others hidden, counts say so.
        box = page.locator("#filter")
        await expect(box).to_be_visible()
        await box.fill("CALCUL")
        await expect(page.locator("#tools tbody tr:visible")).to_have_count(1)
        await expect(page.locator("#tools tbody tr:visible")).to_contain_text("calculate")
        await expect(page.locator("#tools-count")).to_have_text("(1 of 5)")
        await expect(page.locator("#pending tbody tr:visible")).to_have_count(0)
        await expect(page.locator("#replicas tbody tr:visible")).to_have_count(0)
        await box.fill("box-2")
        await expect(page.locator("#replicas tbody tr:visible")).to_have_count(1)
        await expect(page.locator("#replicas-count")).to_have_text("(1 of 2)")
        stub.value = pinned_registry(now, time.time(), time.time(), tools=4)  # the filter holds across a redraw
        await expect(page.locator("#tools-count")).to_have_text("(0 of 4)", timeout=3000)
        await box.fill("")
        await expect(page.locator("#tools tbody tr:visible")).to_have_count(4)
        await expect(page.locator("#tools-count")).to_have_text("(4)")

        # Pinning off (a failover to a replica without it): the table and its mentions go.
        stub.value = pinned_registry(now, time.time(), time.time(), tools=4).model_copy(
            update={"pinning": False, "pending": [], "replicas": []}
        )
        await expect(page.locator("#pending-section")).to_be_hidden(timeout=3000)
        await expect(page.locator("#footer-pending")).to_be_hidden()
        await expect(page.locator("#replicas-section")).to_be_hidden()
        await page.close()


def busy_registry(at: float, usage: ToolUsage | None) -> RegistrySnapshot:
    """One announced tool whose traffic is `usage`, one static tool (never known), one instance heard at `at`."""
    return RegistrySnapshot(
        at=at,
        config_version=3,
        held=[],
        rejections=[],
        rejected_total=0,
        conflicts=[],
        tools=[
            ToolView(
                name="calculate",
                service="calculator",
                workspace="default",
                source="announced",
                status="live",
                instances=1,
                description="Evaluate an expression",
                usage=usage,
            ),
            ToolView(
                name="by-hand",
                service="manual",
                workspace="default",
                source="static",
                status="configured",
                instances=0,
                description="Written by hand",
            ),
        ],
        instances=[
            InstanceView(
                id="calculator-1",
                service="calculator",
                workspace="default",
                version="1.0",
                signer="",
                state="live",
                ttl=15,
                last_seen=at,
            )
        ],
    )


async def test_calls_errors_and_p95_follow_the_heartbeats_in_a_browser(
    browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("discovery.web.feed.BEATS_INTERVAL", 0.0)
    stub = Stub(busy_registry(time.time(), ToolUsage(calls_per_s=12.5, errors_per_s=0.25, p95_ms=3.5)))
    async with served_page(browser, stub) as (page, feed):
        busy, manual = (
            page.locator('#tools tr[data-tool="default/calculate"]'),
            page.locator('#tools tr[data-tool="default/by-hand"]'),
        )
        await expect(busy.locator("td.num")).to_have_text(["12.5", "0.25", "3.50 ms"])
        await expect(manual.locator("td.num")).to_have_text(["-", "-", "-"])
        frames = feed.snapshots

        # Heartbeats move the figures: redrawn from the small `heartbeats` event, never a whole snapshot.
        stub.value = busy_registry(time.time(), ToolUsage(calls_per_s=250.0, errors_per_s=0.0, p95_ms=120.0))
        await expect(busy.locator("td.num")).to_have_text(["250", "0", "120 ms"], timeout=3000)
        stub.value = busy_registry(time.time(), ToolUsage(calls_per_s=0.0, errors_per_s=0.0))
        await expect(busy.locator("td.num")).to_have_text(["0", "0", "-"], timeout=3000)
        stub.value = busy_registry(time.time(), None)
        await expect(busy.locator("td.num")).to_have_text(["-", "-", "-"], timeout=3000)
        assert feed.snapshots == frames, "heartbeats moving the figures sent snapshots"
        await expect(manual.locator("td.num")).to_have_text(["-", "-", "-"])

        # A real change redraws the table with the figures it carries.
        changed = busy_registry(time.time(), ToolUsage(calls_per_s=1.0, errors_per_s=1.0, p95_ms=0.5))
        stub.value = changed.model_copy(update={"config_version": 4})
        await expect(busy.locator("td.num")).to_have_text(["1.00", "1.00", "0.50 ms"], timeout=3000)
        assert feed.snapshots > frames
        await page.close()


# --- the search box: ranked on the server, kept by page.js as the page follows the registry ------------------


async def test_a_search_keeps_its_query_and_order_as_the_page_follows_the_registry_in_a_browser(
    browser: Browser, registry: Registry, connection: Transport
) -> None:
    publisher = await connection.publisher(connection.topics.tool_descriptors)

    async def listed(name: str) -> bool:
        return name in {t.name for t in (await registry.overview.snapshot()).tools}

    async def ranked(url: str, query: str) -> list[str]:
        _, _, body = await acall(f"{url}/search.json?q={quote(query)}")
        return [t["key"] for t in json.loads(body)["tools"]]

    jira = {"jira.ticket.create": "Create a ticket in Jira", "jira.ticket.comment": "Comment on a Jira ticket"}
    await publisher.send(offering("jira", jira))
    await publisher.send(offering("weather", {"weather.now": "The current weather in a city"}))
    await eventually(lambda: listed("weather.now"), timeout=10)
    try:
        async with HealthServer(port=0) as health:
            serve_registry_page(health, registry.overview)
            page: Page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await page.goto(f"{health.url}/")
            await expect(page.locator("#live")).to_have_text("live", timeout=5000)

            # Typed and sent as a plain GET form: the server ranks, the page shows the query and each score.
            await page.locator("#q").fill("archive a jira ticket")
            await page.locator("#q").press("Enter")
            await expect(page).to_have_url(f"{health.url}/?q=archive+a+jira+ticket")
            await expect(page.locator("#live")).to_have_text("live", timeout=5000)
            await page.evaluate("window.sameDocument = true")
            rows = page.locator("#tools tbody tr[data-tool]")
            await expect(rows).to_have_count(2)
            await expect(page.locator("#tools thead th").first).to_have_text("Score")
            order = lambda: rows.evaluate_all("rows => rows.map((row) => row.dataset.tool)")  # noqa: E731

            # A better match comes: shown first, without a reload; the query stays in the box.
            await publisher.send(offering("archive", {"jira.ticket.archive": "Archive a Jira ticket"}))
            await expect(rows.first).to_have_attribute("data-tool", "default/jira.ticket.archive", timeout=3000)
            await expect(rows).to_have_count(3)
            assert await order() == await ranked(health.url, "archive a jira ticket")
            await expect(page.locator("#q")).to_have_value("archive a jira ticket")
            await expect(rows.first.locator("td.score")).to_have_text(re.compile(r"^\d+\.\d\d$"))

            # One that does not match comes: the table is redrawn (its instance shows), the results stay as ranked.
            await publisher.send(offering("mail", {"mail.send": "Send an email"}))
            await expect(page.locator("#instances tbody")).to_contain_text("mail-1", timeout=3000)
            await expect(rows).to_have_count(3)
            assert await order() == await ranked(health.url, "archive a jira ticket")

            # One whose description holds markup matches: shown as text, nothing runs.
            await publisher.send(offering("notes", {"notes.jira": f"{HOSTILE} archive jira ticket notes"}))
            description = page.locator('#tools tr[data-tool="default/notes.jira"] td.description')
            await expect(description).to_have_text(f"{HOSTILE} archive jira ticket notes", timeout=3000)
            assert await description.locator("b, script").count() == 0
            assert await page.evaluate("window.owned === undefined") and await page.title() == "toolreg registry"

            # The best match goes: its row goes; the others keep their order.
            await publisher.send(offering("archive", {"jira.ticket.archive": "x"}, kind="withdraw", sequence=2))
            await expect(page.locator('#tools tr[data-tool="default/jira.ticket.archive"]')).to_have_count(0)
            await expect(rows).to_have_count(3)
            assert await order() == await ranked(health.url, "archive a jira ticket")
            await expect(page.locator("#q")).to_have_value("archive a jira ticket")
            assert await page.evaluate("window.sameDocument === true"), "the page was never reloaded"
            await page.close()

            # JavaScript off: the same box, a plain GET form the page's CSP lets submit to the page itself.
            static = await browser.new_context(java_script_enabled=False)
            try:
                plain = await static.new_page()
                await plain.goto(f"{health.url}/")
                await plain.locator("#q").fill("jira ticket")
                await plain.locator("#q").press("Enter")
                await expect(plain).to_have_url(f"{health.url}/?q=jira+ticket")
                shown = plain.locator("#tools tbody tr[data-tool]")
                assert await shown.evaluate_all("rows => rows.map((r) => r.dataset.tool)") == await ranked(
                    health.url, "jira ticket"
                )
                await expect(plain.locator("#q")).to_have_value("jira ticket")
                await expect(plain.locator("#live")).to_have_text("static page: reload for the latest")
            finally:
                await static.close()
    finally:
        await connection.close_publisher(publisher)

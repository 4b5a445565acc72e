"""The registry page's search box over plain HTTP, attacked as a hostile page or client would: a plain GET form
ranked on the server (JavaScript off), markup and binary in the query shown as text, long queries refused in one
line, only the page's own host and origin answered, and many searches at once at a bounded cost, on one index.

The same search in a real browser, JavaScript on and off, is in tests/web/test_page_browser.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import psutil
import pytest
from support import eventually
from support.registry import offering
from test_page import acall, call

from discovery.registry.service import Registry
from discovery.web.health import HealthServer
from discovery.web.page import SECURITY_HEADERS, TOKEN_ENV, serve_registry_page
from toolservice_base import Transport

HOSTILE = '"><script>window.owned=1</script><img src=x onerror="alert(1)">'
TOOLS = {
    "jira": {
        "jira.ticket.create": "Create a ticket in Jira",
        "jira.ticket.archive": "Archive a Jira ticket once it is done",
    },
    "weather": {"weather.now": "The current weather in a city", "meteo.fr": "La météo actuelle d'une ville"},
    "notes": {"notes.find": f"Find notes about a ticket {HOSTILE}"},
}


async def announce(connection: Transport, registry: Registry, services: dict[str, dict[str, str]]) -> None:
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    try:
        for service, described in services.items():
            await publisher.send(offering(service, described))
    finally:
        await connection.close_publisher(publisher)
    wanted = {name for described in services.values() for name in described}

    async def listed() -> bool:
        return wanted <= {t.name for t in (await registry.overview.snapshot()).tools}

    await eventually(listed, timeout=10)


@pytest.fixture
async def page(registry: Registry, connection: Transport) -> AsyncIterator[HealthServer]:
    await announce(connection, registry, TOOLS)
    async with HealthServer(port=0) as health:
        serve_registry_page(health, registry.overview)
        yield health


def rows(html: str) -> list[str]:
    """The tools table's rows, by `data-tool`, in the order shown."""
    table = html[html.index('<table id="tools">') : html.index("</table>", html.index('<table id="tools">'))]
    return re.findall(r'<tr data-tool="([^"]+)"', table)


async def test_a_search_is_a_plain_get_ranked_on_the_server(page: HealthServer, registry: Registry) -> None:
    status, headers, html = await acall(f"{page.url}/?q={quote('archive a jira ticket')}")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert rows(html)[:2] == ["default/jira.ticket.archive", "default/jira.ticket.create"]
    assert "default/weather.now" not in rows(html), "only the tools that match"
    assert "<th>Score</th>" in html and re.search(r'<td class="num score">\d+\.\d\d</td>', html)
    assert 'value="archive a jira ticket"' in html and 'data-query="archive a jira ticket"' in html
    assert '<form id="search" class="search" method="get" action="./"' in html

    # The form needs the CSP to let it submit to the page itself, and nothing more.
    assert SECURITY_HEADERS["Content-Security-Policy"] == (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
    assert headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]

    # The live page's ranking: the same order, as JSON.
    status, headers, body = await acall(f"{page.url}/search.json?q={quote('archive a jira ticket')}")
    answer = json.loads(body)
    assert status == 200 and headers["content-type"] == "application/json"
    assert [t["key"] for t in answer["tools"]] == rows(html) and answer["error"] is None and answer["total"] == 5

    # No query, or only blanks: the whole table, unranked.
    for address in ("/", "/?q=", "/?q=%20%20"):
        status, _, html = await acall(f"{page.url}{address}")
        assert status == 200 and len(rows(html)) == 5 and "<th>Score</th>" not in html, address
    index = registry.overview.finder.index
    assert (index.builds, index.updates) == (1, 0), "one index, built once, not per request"


async def test_markup_in_the_query_and_in_descriptions_is_shown_as_text(page: HealthServer) -> None:
    status, _, html = await acall(f"{page.url}/?q={quote('notes ' + HOSTILE)}")
    assert status == 200 and rows(html) == ["default/notes.find"]
    assert "<script>window.owned" not in html and "<img src=x" not in html
    escaped = "&#34;&gt;&lt;script&gt;window.owned=1&lt;/script&gt;&lt;img src=x onerror=&#34;alert(1)&#34;&gt;"
    assert html.count(escaped) == 4  # the box, data-query, the heading's note, and the tool's description
    assert html.count("<script") == 1, "only page.js"
    status, headers, body = await acall(f"{page.url}/search.json?q={quote('notes ' + HOSTILE)}")
    assert headers["x-content-type-options"] == "nosniff" and json.loads(body)["query"] == "notes " + HOSTILE


async def test_long_binary_and_unicode_queries_get_a_clear_answer(page: HealthServer) -> None:
    long = "ticket " * 1_500  # 10,500 characters
    status, _, html = await acall(f"{page.url}/?q={quote(long)}")
    assert status == 400 and "search: the query is 10,500 characters long; at most 4,096 are searched" in html
    assert len(re.search(r'id="q" name="q" type="search" value="([^"]*)"', html).group(1)) == 4_096  # type: ignore[union-attr]
    assert "<th>Score</th>" not in html and len(rows(html)) == 5, "the page is still the page"
    status, _, body = await acall(f"{page.url}/search.json?q={quote(long)}")
    assert status == 400 and "at most 4,096" in json.loads(body)["error"] and json.loads(body)["tools"] == []

    for words in ("the", "please, how do I", "%FF%FE%00%01", "%E2%80%8B%E2%80%8B"):  # no words; binary; zero-widths
        status, _, html = await acall(f"{page.url}/?q={words.replace(' ', '+')}")
        assert status == 400 and "no words to search for" in html, words
        assert "\x00" not in html and "\x01" not in html
    status, _, html = await acall(f"{page.url}/?q=%00%FFjira%01ticket")
    assert status == 200 and rows(html)[0].startswith("default/jira.ticket") and "\x00" not in html

    for query, first in (("météo", "default/meteo.fr"), ("MÉTÉO ville", "default/meteo.fr"), ("🎫 jira", None)):
        status, _, html = await acall(f"{page.url}/?q={quote(query)}")
        assert status == 200, query
        if first is not None:
            assert rows(html)[0] == first, query
        assert f'value="{query}"' in html


async def test_only_this_pages_own_host_and_origin_are_answered(page: HealthServer, registry: Registry) -> None:
    url, port = page.url, page.port
    searches = ("/?q=jira", "/search.json?q=jira")
    for path in searches:
        assert (await acall(f"{url}{path}"))[0] == 200
        for host in (f"attacker.example:{port}", f"127.0.0.1.attacker.example:{port}", "localhost.attacker.example"):
            status, _, body = await acall(f"{url}{path}", headers={"Host": host})
            assert status == 403 and "jira" not in body, (path, host)
        for origin in ("http://attacker.example", f"http://127.0.0.1.attacker.example:{port}", "null", "file://"):
            status, _, body = await acall(f"{url}{path}", headers={"Origin": origin})
            assert status == 403 and "own origin" in json.loads(body)["error"] and "ticket" not in body, origin
        assert (await acall(f"{url}{path}", headers={"Origin": f"http://127.0.0.1:{port}"}))[0] == 200
        # What a browser says of a request another site's page made: refused, unless it is following a link.
        for mode in ("no-cors", "cors", "same-origin"):
            headers = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": mode}
            assert (await acall(f"{url}{path}", headers=headers))[0] == 403, (path, mode)
        headers = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
        assert (await acall(f"{url}{path}", headers=headers))[0] == 200
        assert (await acall(f"{url}{path}", "POST"))[0] == 405
    status, _, html = await acall(
        f"{url}/?q=jira", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    )
    assert status == 200 and rows(html), "a link from another site still opens the page"


async def test_off_loopback_searching_needs_the_token(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret-token")
    async with HealthServer(host="0.0.0.0", port=0) as health:
        serve_registry_page(health, registry.overview)
        url = f"http://127.0.0.1:{health.port}"
        for path in ("/?q=jira", "/search.json?q=jira"):
            assert (await acall(f"{url}{path}"))[0] == 401, path
            assert (await acall(f"{url}{path}", headers={"Authorization": "Bearer s3cret-token"}))[0] == 200, path
    assert not registry.overview.finder.index.built or registry.overview.finder.index.builds == 1


def ask(address: str) -> tuple[int, int]:
    """One search: its status and the size of its answer (not kept: what is measured is the server's memory)."""
    status, _, body = call(address)
    return status, len(body)


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


async def test_many_searches_at_once_cost_bounded_memory_and_cpu_on_one_index(
    connection: Transport, registry: Registry
) -> None:
    services = {
        f"fleet-{s}": {
            f"fleet{s}.tool{n}": f"Tool {n} of fleet {s}: manage tickets, notes and weather" for n in range(100)
        }
        for s in range(5)
    }
    await announce(connection, registry, services)
    worst = " ".join(f"word{n}" for n in range(600))[:4_096]  # the longest query taken, every word a lookup
    queries = [quote(q) for q in ("ticket", "weather in a city", "notes of fleet 3", worst, "x" * 10_000, "the")]
    async with HealthServer(port=0) as health:
        serve_registry_page(health, registry.overview)
        assert (await acall(f"{health.url}/search.json?q=ticket"))[0] == 200  # the index is built once, here
        addresses = [f"{health.url}/{'search.json' if n % 2 else ''}?q={queries[n % len(queries)]}" for n in range(200)]
        first, _, _ = await searches(addresses)  # the server's pools and buffers grow to what such a load needs
        settled = rss_mb()
        answers, spent, took = await searches(addresses)
        grown = rss_mb() - settled
    assert sorted({status for status, _ in answers}) == [200, 400]  # the 10 KB query and "the": refused, in a line
    assert [status for status, _ in first] == [status for status, _ in answers]
    assert max(size for _, size in answers) < 600_000, "at most 100 rows, however many tools match"
    assert spent / len(addresses) < 0.05, f"{spent / len(addresses) * 1000:.1f} ms of CPU a search (server and client)"
    assert grown < 10, f"{grown:.1f} MB more after another {len(addresses)} searches: memory grows with requests"
    index = registry.overview.finder.index
    assert (index.builds, index.updates) == (1, 0), "searches share one index; nothing changed, nothing written"
    assert took < 60


async def searches(addresses: list[str]) -> tuple[list[tuple[int, int]], float, float]:
    """Every address asked, 48 at once: the answers (status, size), the CPU the process spent, and how long."""
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=48) as pool:
        answers = await asyncio.gather(*(asyncio.wrap_future(pool.submit(ask, a)) for a in addresses))
    took = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    return answers, (after.ru_utime + after.ru_stime) - (cpu.ru_utime + cpu.ru_stime), took

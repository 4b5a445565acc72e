"""Calls per caller on the registry page: what `toolreg mcp` fronts publish on the audit topic, read by the registry
(a separate process in production: only the topic links them), counted per subject within bounded memory, and only
from records a trusted front signed."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support import eventually
from support.registry import FAST

from discovery.audit_chain import AuditChain
from discovery.mcp.auth import AuditTrail, Caller
from discovery.registry.callers import CallerBook
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from discovery.web.page import render
from toolservice_base import Transport, open_transport
from toolservice_base.schemas import AuditRecord
from toolservice_base.settings import Settings
from toolservice_base.signing import key_id

FRONT_KEY = Ed25519PrivateKey.generate()
FRONTS = {key_id(FRONT_KEY.public_key()): FRONT_KEY.public_key()}


@pytest.fixture
async def following(connection: Transport, config_store: ConfigStoreService) -> AsyncIterator[Registry]:
    registry = Registry(connection, options=dataclasses.replace(FAST, follow_audit=True, audit_fronts=FRONTS))
    await registry.start()
    yield registry
    await registry.stop()


async def test_calls_published_by_a_front_show_per_caller_on_the_page(following: Registry, settings: Settings) -> None:
    front = await open_transport(settings)  # the front's own connection, as `toolreg mcp` has
    trail = AuditTrail("default", key=FRONT_KEY)
    agent, hostile = Caller("agent-7", client_id="calc-agent", authenticated=True), Caller("<script>x</script>")
    try:
        async with trail.publishing(front):
            started = time.monotonic()
            for outcome in ("ok", "ok", "denied", "rate_limited", "tool_error"):
                trail.record(agent, "calculate", outcome, started)  # type: ignore[arg-type]
            trail.record(hostile, "echo", "ok", started)
    finally:
        await front.close()

    async def counted() -> bool:
        callers = (await following.overview.snapshot()).callers or []
        return sum(c.calls for c in callers) == 6

    await eventually(counted, timeout=10)
    snapshot = await following.overview.snapshot()
    assert snapshot.callers is not None
    first = snapshot.callers[0]
    assert (first.subject, first.client_id, first.calls, first.refused, first.failed, first.tools) == (
        "agent-7",
        "calc-agent",
        5,
        2,
        1,
        ["calculate"],
    )
    html = render(snapshot)
    assert 'id="callers-section"' in html and "agent-7" in html
    assert "<script>x</script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html


def test_the_book_is_bounded_and_skips_what_does_not_parse() -> None:
    book = CallerBook(fronts=FRONTS, max_callers=10)
    chain = AuditChain("f", FRONT_KEY)
    now = time.time()
    for n in range(1000):
        record = AuditRecord(
            at=now, front="f", workspace="default", subject=f"s{n}", tool="t", outcome="ok", duration_ms=1.0
        )
        book.add_bytes(chain.seal(record).to_json().encode())
    book.add_bytes(b"{not json")
    book.add_bytes(b"x" * 100_000)
    old = AuditRecord(
        at=now - 2 * book.window, front="f", workspace="w", subject="old", tool="t", outcome="ok", duration_ms=1
    )
    book.add_bytes(chain.seal(old).to_json().encode())
    assert len(book.callers) == 10 and book.unverified == 2 and "old" not in book.callers
    assert [v.subject for v in book.views()][:2] == ["s990", "s991"]

"""Fixtures for the agent-framework tests (test_*_live_tools.py): announced services on a real broker, and a live
ToolSet on them.

Every framework test runs the framework's own agent loop with its own test
model; only the model is scripted. The tools come from real services that
announce themselves to a real registry, which writes them to a real config
store, which the ToolSet follows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.live import CALL_TIMEOUT, Services

from agent_bridge import ToolSet
from toolservice_base import Settings, Transport


@pytest.fixture
async def live_toolset(connection: Transport, settings: Settings, registry: Any) -> AsyncIterator[ToolSet]:
    """A live ToolSet on the test's store, with a registry merging announcements into it (empty at first)."""
    async with ToolSet(connection=connection, settings=settings, poll_interval=60, limits=CALL_TIMEOUT) as tools:
        yield tools


@pytest.fixture
async def live_services(settings: Settings, live_toolset: ToolSet) -> AsyncIterator[Services]:
    started = Services(settings, live_toolset)
    yield started
    await started.close()

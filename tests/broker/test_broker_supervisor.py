"""`BrokerSupervisor` on a real pulsar-lite: restart on the same port, back off, give up in one line."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest
from support import eventually

from discovery.broker import EmbeddedBroker
from discovery.broker.embedded import accepts_connections
from discovery.broker.supervisor import BrokerSupervisor
from discovery.errors import BrokerError

FAST = (0.0, 0.05, 0.05)


async def test_a_killed_broker_is_back_on_its_port_within_a_fraction_of_a_second(broker: EmbeddedBroker) -> None:
    supervisor = BrokerSupervisor(broker)
    url, pid = broker.url, broker.pid
    async with supervisor.running():
        assert supervisor.readiness() is None
        broker.kill()
        killed = time.monotonic()
        await eventually(lambda: supervisor.restarts == 1, timeout=5.0, interval=0.005)
        assert time.monotonic() - killed < 1.0
        assert broker.url == url and broker.pid != pid and broker.port is not None and accepts_connections(broker.port)
        assert supervisor.last_downtime is not None and supervisor.last_downtime < 1.0
        assert supervisor.readiness() is None
    assert broker.alive()  # leaving supervision does not stop the broker; `stop()` does


async def test_it_gives_up_in_one_line_when_another_program_took_the_port(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path)
    broker.start()
    supervisor = BrokerSupervisor(broker, delays=FAST)
    try:
        broker.kill()  # dead before supervision starts: the port is free for a moment
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", broker.port or 0))
            squatter.listen()
            with pytest.raises(BrokerError) as caught:
                await asyncio.wait_for(supervisor.run(), 10)
        message = str(caught.value)
        assert "\n" not in message and f"port {broker.port}" in message and "taken by another process" in message
        assert str(broker.log_file) in message
        assert supervisor.readiness() is not None and "down" in supervisor.readiness()  # type: ignore[operator]
    finally:
        broker.stop()


async def test_a_broker_that_keeps_dying_is_a_crash_loop_and_it_gives_up(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path)
    broker.start()
    supervisor = BrokerSupervisor(broker, delays=FAST, max_deaths=2, window=60.0)
    try:
        task = asyncio.create_task(supervisor.run())
        for restarts in (1, 2):
            broker.kill()
            await eventually(lambda: supervisor.restarts == restarts, timeout=5.0, interval=0.005)  # noqa: B023
        broker.kill()
        with pytest.raises(BrokerError, match="died 3 times within 60s"):
            await asyncio.wait_for(task, 5)
    finally:
        broker.stop()

"""One config store per topicspace: a second store refuses to start, naming the one already answering.

Two stores on one broker and topicspace share the config queues'
subscription: the broker hands requests to each in turn, so reads alternate
found and missing and versions go 1, 9, 2, 10. Each store (SQLite or a
replica of the replicated one) says it is there on the members topic; a
starting one asks who is there and refuses in one line, and one that hears
another while it runs logs it as an error and fails its `/readyz`.
Real `toolreg up` processes on the run's Apache Pulsar, a fresh tenant each.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
from support import atoolreg, eventually
from support.replicas import Cluster

from discovery.store.presence import StorePresence
from toolservice_base import open_transport

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(180)]


@pytest.fixture
async def opened(tenant: str) -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused `toolreg up` says (its JSON log lines aside), exit code 1, nothing served."""
    assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
    said = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("{")]
    assert len(said) == 1 and said[0].startswith("toolreg: "), done.stderr[-3000:]
    assert "ready in" not in done.stdout
    return said[0]


async def test_a_second_store_of_either_kind_refuses_to_start_naming_the_one_that_answers(cluster: Cluster) -> None:
    await cluster.start("first", "--store", "sqlite")
    pid = cluster.processes["first"].pid
    for second in ("sqlite", "pulsar"):
        done = await atoolreg("up", "--store", second, "--metrics-port", "0", env=cluster.env(f"second-{second}"))
        line = one_line(done)
        assert "another config store already answers on this topicspace: sqlite store" in line, line
        assert f"pid {pid} " in line and "run one store per topicspace" in line, line
    assert cluster.readyz("first")[0] == 200, "the first one serves on"


async def test_a_sqlite_store_refuses_to_start_beside_a_replicated_group(cluster: Cluster) -> None:
    await cluster.start("replica")
    done = await atoolreg("up", "--store", "sqlite", "--metrics-port", "0", env=cluster.env("late"))
    line = one_line(done)
    assert "another config store already answers on this topicspace: replicated store" in line, line
    assert f"pid {cluster.processes['replica'].pid} " in line


async def test_a_running_store_that_hears_another_says_so_in_its_log_and_readyz(
    cluster: Cluster, opened: AsyncExitStack
) -> None:
    await cluster.start("first", "--store", "sqlite")
    assert cluster.readyz("first")[0] == 200
    connection = await opened.enter_async_context(await open_transport(cluster.settings()))
    # A store that did not ask before it started (one of an older version, or started in the same moment).
    rival = await opened.enter_async_context(StorePresence(connection, look=False))

    def refused() -> dict[str, object] | None:
        status, body = cluster.readyz("first")
        return body if status == 503 else None

    body = await eventually(refused, timeout=10)
    assert rival.replica_id in str(body) and "another config store already answers" in str(body), body
    assert "membership.rival_store" in cluster.output("first")

"""Least privilege on the broker: a role per kind of process, each doing its job and refused, in one line, at others'.

deploy/pulsar-init.sh grants four roles (`TOOLREG_STORE_ROLE`,
`TOOLREG_SERVICE_ROLE`, `TOOLREG_AGENT_ROLE`, `TOOLREG_OPERATOR_ROLE`) what
their kind needs on the topicspace's namespaces, and reserves the store's
subscriptions (`config-store`, `tool-registry`) for the store's role;
`ApachePulsar.grant_kinds` makes the same grants on the run's Apache Pulsar
(authorization on). Each role then runs each kind's job through the
product's own code. The store's role is the trusted one (it runs the store,
the registry and the replicated state, so it may do nearly everything); an
operator may do what an agent does, and read the state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from apache_pulsar import KIND_GRANTS, ApachePulsar
from support.roles import kind_settings

from discovery.replicas import Election
from discovery.replicas.markers import lock_holder
from discovery.store.service import ConfigStoreService
from discovery.store.sqlite import ConfigStore
from toolservice_base import ConfigClient, Settings, ToolDiscoveryError, open_transport, watch_config
from toolservice_base.examples.echo import EchoService

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(240)]

KINDS = tuple(KIND_GRANTS)


async def serve_the_config_store(settings: Settings) -> None:
    """A replica's job: answer the config queues on the `config-store` subscription."""
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(settings))
        service = ConfigStoreService(connection, ConfigStore.in_memory("roles"))
        stack.push_async_callback(service.stop)
        await service.start()


async def write_the_replicated_state(settings: Settings) -> None:
    """A replica's job too: take the store's lock (and so write its log)."""
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(settings))
        await stack.enter_async_context(Election(connection, connection.topics.state_lock, "roles"))


async def serve_and_announce_a_tool(settings: Settings) -> None:
    """A tool service's job: consume its requests, answer them, announce itself."""
    async with EchoService(settings=settings):
        pass


async def read_config_and_follow_pushes(settings: Settings) -> None:
    """An agent's job (a ToolSet, an MCP front): ask the store, and follow its pushes."""
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(settings))
        client = await stack.enter_async_context(ConfigClient(connection, timeout=5))
        await client.get([("tool", "any")])

        async def ignore(_: object) -> None:
            return None

        await connection.unsubscribe(await watch_config(connection, ignore))


async def read_the_replicated_state(settings: Settings) -> None:
    """An operator's job beyond an agent's (`toolreg replicas`, `toolreg store export`): read the state topics."""
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(settings))

        async def ignore(_: object) -> None:
            return None

        await connection.unsubscribe(await connection.subscribe(connection.topics.state_members, ignore))
        await lock_holder(connection, connection.topics.state_lock, None)


JOBS: dict[str, tuple[Callable[[Settings], Awaitable[None]], set[str]]] = {
    "serve the config store": (serve_the_config_store, {"store"}),
    "write the replicated state": (write_the_replicated_state, {"store"}),
    "serve and announce a tool": (serve_and_announce_a_tool, {"store", "service"}),
    "read config and follow its pushes": (read_config_and_follow_pushes, {"store", "agent", "operator"}),
    "read the replicated state": (read_the_replicated_state, {"store", "operator"}),
}
"""Each kind's job, and the roles allowed to do it."""


@pytest.fixture
async def granted(apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path) -> AsyncIterator[dict[str, Settings]]:
    """Each kind's settings (its own role's token) on a tenant granted as deploy/pulsar-init.sh grants; the store
    running under its role, so that other kinds' requests are answered."""
    settings = kind_settings(apache_pulsar, tenant, tmp_path, KINDS)
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(settings["store"]))
        await stack.enter_async_context(ConfigStoreService(connection, ConfigStore.in_memory("store")))
        yield settings


async def test_each_role_does_its_job_and_is_refused_in_one_line_at_the_jobs_of_the_others(
    granted: dict[str, Settings],
) -> None:
    outcomes: dict[tuple[str, str], str | None] = {}
    for job, (run, _) in JOBS.items():
        for kind, settings in granted.items():
            try:
                await run(settings)
                outcomes[(job, kind)] = None
            except ToolDiscoveryError as exc:
                outcomes[(job, kind)] = str(exc)
    wrong = {
        f"{kind}: {job}": said or "done"
        for (job, kind), said in outcomes.items()
        if (said is None) != (kind in JOBS[job][1])
    }
    assert wrong == {}, wrong
    for (job, kind), said in outcomes.items():
        if said is not None:
            assert "\n" not in said and f"role {kind}-" in said and "AuthorizationError" in said, (job, kind, said)


async def test_a_role_that_may_consume_requests_cannot_join_the_stores_subscription_and_swallow_its_requests(
    granted: dict[str, Settings],
) -> None:
    """A tool service's role consumes in the request namespace; the config store's subscription is not for it."""
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(granted["service"]))

        async def swallow(_: object) -> None:
            return None

        for queue, subscription in (
            (connection.topics.config_request, "config-store"),
            (connection.topics.registry_request, "tool-registry"),
        ):
            with pytest.raises(ToolDiscoveryError) as refused:
                await connection.subscribe(queue, swallow, subscription=subscription, shared=True)
            said = str(refused.value)
            assert f"not through subscription {subscription!r}" in said and "\n" not in said, said
        store = await stack.enter_async_context(await open_transport(granted["store"]))
        client = await stack.enter_async_context(ConfigClient(store, timeout=5))
        for n in range(6):  # every request is answered: nobody else is on the subscription
            assert await client.put([("note", f"n{n}", "x")]) > 0

"""The config store (spec section 5), over a real broker."""

from __future__ import annotations

import json

import pytest
from support import eventually

from discovery.store.service import ConfigStoreService
from toolservice_base import (
    ConfigClient,
    ConfigConflict,
    ConfigError,
    ConfigPush,
    Settings,
    Transport,
    watch_config,
)
from toolservice_base.examples.joke import JokeService

pytestmark = pytest.mark.contract

JOKE = JokeService.tools[0] | {"type": "tool-service", "service": "joke-service"}
JOKE_SERVICE = {
    "id": "joke-service",
    "request-queue": "non-persistent://tg/request/joke",
    "response-queue": "non-persistent://tg/response/joke",
    "config-params": [{"name": "style", "required": True}],
}


async def test_put_get_list_getvalues_config(config_client: ConfigClient) -> None:
    v1 = await config_client.put(
        [("tool-service", "joke-service", json.dumps(JOKE_SERVICE)), ("tool", "tell-joke", json.dumps(JOKE))]
    )
    assert v1 == 1
    got = await config_client.get([("tool", "tell-joke"), ("tool", "missing")])
    assert json.loads(got[("tool", "tell-joke")])["name"] == "tell-joke"
    assert ("tool", "missing") not in got
    assert await config_client.list("tool") == ["tell-joke"]
    assert set(await config_client.getvalues("tool-service")) == {"joke-service"}
    version, config = await config_client.config()
    assert version == 1 and set(config) == {"tool", "tool-service"}


async def test_one_version_bump_per_write_and_none_for_no_change(config_client: ConfigClient) -> None:
    v1 = await config_client.put([("prompt", "a", "1"), ("prompt", "b", "2")])
    v2 = await config_client.put([("prompt", "a", "1")])
    v3 = await config_client.delete([("prompt", "missing")])
    v4 = await config_client.delete([("prompt", "a"), ("prompt", "b")])
    assert (v1, v2, v3, v4) == (1, 1, 1, 2)


async def test_workspaces_are_separate(config_client: ConfigClient) -> None:
    await config_client.put([("prompt", "a", "one")], workspace="alpha")
    assert await config_client.list("prompt", workspace="beta") == []
    assert await config_client.list("prompt", workspace="alpha") == ["a"]


@pytest.mark.parametrize(
    ("item_type", "key", "value", "named"),
    [
        ("tool", "tell-joke", "{not json", "not JSON"),
        ("tool", "tell-joke", json.dumps({**JOKE, "name": "bad name!"}), "name"),
        ("tool", "tell-joke", json.dumps({k: v for k, v in JOKE.items() if k != "description"}), "description"),
        ("tool", "other", json.dumps(JOKE), "the key is 'other'"),
        (
            "tool",
            "tell-joke",
            json.dumps({**JOKE, "arguments": [{"name": "t", "type": "str", "description": "x"}]}),
            "arguments.0.type",
        ),
        ("tool-service", "joke-service", json.dumps({**JOKE_SERVICE, "request-queue": "http://x"}), "request-queue"),
        (
            "tool-service",
            "joke-service",
            json.dumps({k: v for k, v in JOKE_SERVICE.items() if k != "response-queue"}),
            "response-queue",
        ),
    ],
)
async def test_bad_items_are_refused_naming_the_field_and_store_nothing(
    config_client: ConfigClient, item_type: str, key: str, value: str, named: str
) -> None:
    await config_client.put([("prompt", "keep", "x")])
    with pytest.raises(ConfigError, match=named):
        await config_client.put([("prompt", "other", "y"), (item_type, key, value)])
    version, config = await config_client.config()
    assert version == 1 and config == {"prompt": {"keep": "x"}}


async def test_tool_missing_a_required_param_of_its_stored_service_is_refused(config_client: ConfigClient) -> None:
    await config_client.put([("tool-service", "joke-service", json.dumps(JOKE_SERVICE))])
    no_style = {k: v for k, v in JOKE.items() if k != "style"}
    with pytest.raises(ConfigError, match="required config param style"):
        await config_client.put([("tool", "tell-joke", json.dumps(no_style))])
    assert await config_client.list("tool") == []


async def test_conditional_write_refuses_when_the_item_changed(config_client: ConfigClient) -> None:
    await config_client.put([("prompt", "a", "operator")])
    with pytest.raises(ConfigConflict):
        await config_client.apply(puts=[("prompt", "a", "registry")], expect=[("prompt", "a", None)])
    assert (await config_client.get([("prompt", "a")]))[("prompt", "a")] == "operator"


async def test_every_change_is_pushed_with_its_version_and_types(
    connection: Transport, config_client: ConfigClient
) -> None:
    pushes: list[ConfigPush] = []

    async def on_push(push: ConfigPush) -> None:
        pushes.append(push)

    await watch_config(connection, on_push)
    await config_client.put([("tool-service", "joke-service", json.dumps(JOKE_SERVICE))])
    await config_client.put([("prompt", "x", "1")], workspace="alpha")
    await eventually(lambda: len(pushes) == 2)
    # A tool-service change names tool too: TrustGraph's agent rebuilds from only the types a push names.
    assert pushes[0].version == 1 and pushes[0].changes == {"tool": ["default"], "tool-service": ["default"]}
    assert pushes[1].version == 2 and pushes[1].changes == {"prompt": ["alpha"]}
    assert pushes[0].workspace_changes is not None and pushes[0].workspace_changes.created == ["default"]
    assert pushes[1].workspace_changes is not None and pushes[1].workspace_changes.created == ["alpha"]


async def test_config_survives_a_store_restart(
    connection: Transport, config_store: ConfigStoreService, settings
) -> None:
    client = ConfigClient(connection, timeout=5)
    await client.put([("prompt", "a", "kept")])
    await config_store.stop()
    restarted = ConfigStoreService.in_data_dir(connection, settings.data_dir)
    await restarted.start()
    try:
        assert await client.get([("prompt", "a")]) == {("prompt", "a"): "kept"}
        assert (await client.config())[0] == 1
    finally:
        await client.close()
        await restarted.stop()


async def test_garbage_requests_get_an_error_and_the_store_keeps_serving(
    connection: Transport, config_client: ConfigClient
) -> None:
    from toolservice_base import RequestClient

    raw = RequestClient(connection, connection.topics.config_request, connection.topics.config_response)
    for garbage in (b"\xff\x00", b"[]", b'{"operation": "explode"}', b'{"operation": "list"}'):
        body = await raw.request(garbage, timeout=5)
        assert body["error"]["type"] in {"bad-request", "bad-operation", "invalid"}
    await raw.close()
    assert await config_client.put([("prompt", "ok", "1")]) == 1


async def test_the_store_service_starts_and_stops_with_async_with(connection: Transport, settings: Settings) -> None:
    async with ConfigStoreService.in_data_dir(connection, settings.data_dir) as service:
        assert service.readiness() is None
        client = ConfigClient(connection, timeout=5)
        await client.start()
        try:
            assert await client.put([("note", "a", "1")]) == 1
        finally:
            await client.close()
    assert service.readiness() == "stopped"

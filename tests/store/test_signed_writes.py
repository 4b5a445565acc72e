"""Under `"config-writes": "signed"`: what the registry owns, only the registry or a signed operator writes; and a
signed write is signed whole and taken once.

An insider who may send on the config queue must not be able to write the
registry's records unsigned (a `discovery-pin` naming a held definition, its
`pending-definition` deleted: the change served at the next failover), nor
make a captured signed write count twice: sent again exactly (after a
failover too), with its signature's base64 re-spelt, to another topicspace,
or after it expired.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, cast

import pytest
from support import eventually
from support.replicas import Group
from support.signed import capturing, guard_for, operator, padding_bits_changed, replaying, signer

from discovery.registry.merge import RECORD_TYPE
from discovery.registry.pin_rules import PENDING_TYPE, PIN_TYPE
from discovery.registry.store_writes import PROBE_WORKSPACE
from discovery.replicas import GroupKey, LogEntry
from discovery.store.log_state import LogJournal, StoreState, entry_payload
from discovery.store.sqlite import ConfigStore, Write
from discovery.store.write_policy import REFUSAL, REGISTRY_TYPES, REGISTRY_WORKSPACE, ConfigWriteGuard, Taken
from toolservice_base import ConfigClient, ConfigError, MemoryBroker, Settings
from toolservice_base.schemas import ConfigRequest, ConfigResponse
from toolservice_base.signing import key_id, sign_config_request

pytestmark = pytest.mark.timeout(120)

TOPICSPACE = "tg"
TOOL = {"type": "tool-service", "name": "rogue-tool", "description": "whatever it wants", "service": "rogue"}


def write(item_type: str, key: str, workspace: str = "default", *, delete: bool = False) -> ConfigRequest:
    if delete:
        return ConfigRequest(operation="delete", workspace=workspace, keys=[{"type": item_type, "key": key}])
    return ConfigRequest(operation="put", workspace=workspace, values=[{"type": item_type, "key": key, "value": "{}"}])


REGISTRY_OWNED = [
    ("discovery", "tell-joke", "default"),
    ("discovery-pin", "tell-joke", "default"),
    ("pending-definition", "default/tell-joke", "_toolreg"),
    ("registry", "departed", "_toolreg"),
]
"""One of each kind the registry owns: its records in a workspace, and any item of its own workspace."""


def test_the_kinds_the_guard_keeps_for_the_registry_are_the_ones_it_writes() -> None:
    assert REGISTRY_TYPES == (RECORD_TYPE, PIN_TYPE, PENDING_TYPE) and REGISTRY_WORKSPACE == PROBE_WORKSPACE


@pytest.mark.parametrize(("item_type", "key", "workspace"), REGISTRY_OWNED)
def test_an_unsigned_write_of_what_the_registry_owns_is_refused_as_an_unsigned_write_of_tools_is(
    tmp_path: Path, item_type: str, key: str, workspace: str
) -> None:
    alice = operator(tmp_path, "alice")
    guard = guard_for(TOPICSPACE, {"alice": alice})
    refusal = guard.refusal(write("tool", "rogue-tool"))
    assert refusal is not None and "--signing-key" in refusal
    for delete in (False, True):
        request = write(item_type, key, workspace, delete=delete)
        assert guard.covers(request), request
        assert guard.refusal(request) == refusal
        assert guard.refusal(signer(alice, TOPICSPACE)(request)) is None, "an operator may write it, signed"


def test_other_items_stay_the_broker_permissions_business(tmp_path: Path) -> None:
    guard = guard_for(TOPICSPACE, {"alice": operator(tmp_path, "alice")})
    assert not guard.covers(write("note", "anything"))
    assert not guard.covers(ConfigRequest(operation="getvalues", workspace="_toolreg", type="registry"))


def test_a_write_signed_for_another_topicspace_is_refused_with_a_line_naming_it(tmp_path: Path) -> None:
    alice = operator(tmp_path, "alice")
    group = GroupKey.generate()
    guard = guard_for(TOPICSPACE, {"alice": alice}, group)
    for signed in (signer(alice, "other")(write("tool", "x")), group.sign_config(write("tool", "x"), "other")):
        said = guard.refusal(signed) or ""
        assert "signed for topicspace 'other'" in said and f"not this store's {TOPICSPACE!r}" in said, said
        assert "\n" not in said
    respelt = signer(alice, "other")(write("tool", "x"))
    assert respelt.signature is not None
    forged = respelt.model_copy(update={"signature": respelt.signature.replace(":other:", f":{TOPICSPACE}:")})
    assert "does not match" in (guard.refusal(forged) or ""), "the topicspace is signed, not only named"


def test_an_expired_signature_is_refused_and_so_is_one_good_for_longer_than_a_signature_may_be(tmp_path: Path) -> None:
    alice = operator(tmp_path, "alice")
    guard = guard_for(TOPICSPACE, {"alice": alice})
    sign = signer(alice, TOPICSPACE)
    expired = sign_config_request(write("tool", "x"), alice, TOPICSPACE, now=time.time() - 75)
    said = guard.refusal(expired) or ""
    assert "the signature expired 15s ago" in said and "sign it again" in said, said
    eternal = sign_config_request(write("tool", "x"), alice, TOPICSPACE, lifetime=3600)
    assert "more than a signature may be good for" in (guard.refusal(eternal) or "")
    assert guard.refusal(sign(write("tool", "x"))) is None


@pytest.mark.parametrize("by", ["operator", "registry"])
def test_a_signature_whose_base64_padding_bits_were_changed_is_refused(tmp_path: Path, by: str) -> None:
    alice = operator(tmp_path, "alice")
    group = GroupKey.generate()
    guard = guard_for(TOPICSPACE, {"alice": alice}, group)
    signed = (
        signer(alice, TOPICSPACE)(write("tool", "x"))
        if by == "operator"
        else group.sign_config(write("tool", "x"), TOPICSPACE)
    )
    assert guard.refusal(signed) is None
    said = guard.refusal(padding_bits_changed(signed)) or ""
    assert "not in canonical base64" in said, said


def test_a_signature_made_by_an_older_toolreg_is_refused_with_a_line_saying_to_upgrade_where_it_was_signed(
    tmp_path: Path,
) -> None:
    """The older form signed the request and when, and nothing else: `ed25519:<key id>:<signed-at>:<base64>`."""
    alice = operator(tmp_path, "alice")
    guard = guard_for(TOPICSPACE, {"alice": alice})
    request, signed_at = write("tool", "x"), f"{time.time():.3f}"
    raw = alice.sign(request.signed_part() + b"\n" + signed_at.encode())
    older = f"ed25519:{key_id(alice.public_key())}:{signed_at}:{base64.b64encode(raw).decode()}"
    said = guard.refusal(request.model_copy(update={"signature": older})) or ""
    assert "signed the older way" in said and "upgrade toolreg where it was signed" in said, said


class Served:
    """A store behind the guard: counts the writes it makes, and what the journal logs each under."""

    def __init__(self) -> None:
        self.logged: list[str] = []

    async def __call__(self, logged_as: str) -> ConfigResponse:
        self.logged.append(logged_as)
        return ConfigResponse(version=len(self.logged))


async def test_a_copy_of_a_taken_signed_write_is_refused_and_the_senders_resend_answered_as_the_first_was(
    tmp_path: Path,
) -> None:
    alice = operator(tmp_path, "alice")
    guard, served = guard_for(TOPICSPACE, {"alice": alice}), Served()
    signed = signer(alice, TOPICSPACE)(write("tool", "x"))
    first = await guard.serve(signed, served, request_id="sender-1")
    assert first.error is None and first.version == 1
    resend = await guard.serve(signed, served, request_id="sender-1")
    assert resend.error is None and resend.version == 1
    copy = await guard.serve(signed, served, request_id="insider-1")
    assert copy.error is not None and copy.error.type == REFUSAL
    assert "a copy of a signed write already taken (at version 1)" in copy.error.message
    assert len(served.logged) == 1


async def test_the_log_carries_a_signed_writes_nonce_so_another_replica_refuses_a_copy_of_it(tmp_path: Path) -> None:
    """Replica A takes a signed write; replica B applies A's log entry, becomes active, and is sent a copy."""
    alice = operator(tmp_path, "alice")
    signed = signer(alice, TOPICSPACE)(write("tool", "x"))
    on_a, served = guard_for(TOPICSPACE, {"alice": alice}), Served()
    assert (await on_a.serve(signed, served, request_id="sender-1")).error is None
    payload = entry_payload(Write(1, "default", [("tool", "x", "{}")], []), served.logged[0])
    assert payload["request"] == "sender-1" and payload["signed"][0] in (signed.signature or "")
    state = StoreState(ConfigStore.in_memory("b"))
    state.apply(LogEntry(1, json.loads(json.dumps(payload))))
    journal_b = LogJournal(cast(Any, None), cast(Any, None), state)
    on_b, served_b = guard_for(TOPICSPACE, {"alice": alice}), Served()
    copy = await on_b.serve(signed, served_b, request_id="insider-1", journal=journal_b)
    assert copy.error is not None and "already taken (at version 1)" in copy.error.message
    resend = await on_b.serve(signed, served_b, request_id="sender-1", journal=journal_b)
    assert resend.error is None and resend.version == 1
    assert served_b.logged == []


def test_a_snapshot_keeps_the_signed_writes_not_yet_expired_and_drops_the_others() -> None:
    now = time.time()
    state = StoreState(ConfigStore.in_memory("a"))
    state.apply(LogEntry(1, entry_payload(Write(1, "default", [("note", "n", "v")], []))))
    state.signed.take("b" * 32, Taken(now - 1, 1, "sender-2"), now=now - 10)  # taken while good; expired since
    state.signed.take("a" * 32, Taken(now + 60, 1, "sender-1"), now=now - 10)
    restored = StoreState(ConfigStore.in_memory("b"))
    restored.restore(1, list(state.snapshot()))
    assert restored.signed.get("a" * 32) == Taken(now + 60, 1, "sender-1")
    assert restored.signed.get("b" * 32) is None
    assert restored.store.dump() == state.store.dump(), "the memory is not an item"


# --- a replicated store, in process: a copy sent exactly after a failover ---------------------------------------------


@pytest.fixture
async def group(memory_broker: MemoryBroker, tmp_path: Path) -> AsyncIterator[Group]:
    async with AsyncExitStack() as stack:
        yield Group(Settings(data_dir=tmp_path / "data", pulsar_url=memory_broker.url), stack)


async def test_a_captured_signed_write_sent_exactly_again_after_a_failover_is_refused_and_changes_nothing(
    group: Group, tmp_path: Path
) -> None:
    alice = operator(tmp_path, "alice")
    guards: list[ConfigWriteGuard] = [guard_for(TOPICSPACE, {"alice": alice}) for _ in range(2)]
    first = await group.start("first", write_guard=guards[0])
    await eventually(lambda: first.service is not None, timeout=15)
    second = await group.start("second", write_guard=guards[1])
    captured: list[ConfigRequest] = []
    async with AsyncExitStack() as stack:
        connection = await group.connection()
        operator_client = await stack.enter_async_context(
            ConfigClient(connection, timeout=5, sign=capturing(signer(alice, TOPICSPACE), captured))
        )
        await operator_client.put([("tool", "rogue-tool", json.dumps(TOOL))])
        put = captured[0]
        await operator_client.delete([("tool", "rogue-tool")])
        await eventually(lambda: second.version == first.version, timeout=10)
        await group.stop(first)
        await eventually(lambda: second.service is not None, timeout=30)
        replayer = await stack.enter_async_context(ConfigClient(connection, timeout=5, sign=replaying(put)))
        with pytest.raises(ConfigError, match="already taken"):
            await replayer.put([("note", "ignored", "x")])
        assert await operator_client.list("tool") == [], "the deleted tool came back"

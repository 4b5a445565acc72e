"""Merge rules (pure, no broker): static wins, first holder keeps it, only what it wrote."""

from __future__ import annotations

import json

from discovery.registry.merge import (
    InstanceRecord,
    Key,
    Offer,
    OwnershipRecord,
    apply_plan,
    combine,
    plan_service,
    record_key,
    value_hash,
)
from toolservice_base.schemas import (
    ToolDescriptor,
    ToolServiceDescriptor,
    descriptor_digest,
)


def offer(service_id: str, *tools: str, description: str = "does things") -> Offer:
    service = ToolServiceDescriptor.model_validate(
        {
            "id": service_id,
            "request-queue": f"non-persistent://tg/request/{service_id}",
            "response-queue": f"non-persistent://tg/response/{service_id}",
        }
    )
    parsed = tuple(ToolDescriptor(name=name, description=description, service=service_id) for name in tools)
    return Offer(service, parsed, descriptor_digest(service, list(parsed)), "1.0")


def base_record(service_id: str, *instances: str, digest: str | None = None) -> OwnershipRecord:
    return OwnershipRecord(
        service=service_id,
        workspace="default",
        digest=digest,
        instances={i: InstanceRecord(ttl=2.0, since=1.0) for i in instances},
    )


def converge(
    view: dict[Key, str | None],
    service_id: str,
    the_offer: Offer | None,
    owned: dict[Key, str] | None = None,
    owners: dict[Key, str] | None = None,
    gone: bool = False,
):
    record = None if gone else base_record(service_id, "i1", digest=the_offer.digest if the_offer else None)
    return plan_service(view, owners or {}, service_id=service_id, owned=owned or {}, record=record, offer=the_offer)


def test_a_new_service_writes_the_spec_items_as_wire_json_and_its_record() -> None:
    joke = offer("joke", "tell-joke", "tell-pun")
    plan = converge({}, "joke", joke)
    assert plan.writes[("tool-service", "joke")] == joke.service.to_json()
    assert json.loads(plan.writes[("tool", "tell-joke")]) == {  # type: ignore[arg-type]
        "type": "tool-service",
        "name": "tell-joke",
        "description": "does things",
        "service": "joke",
        "arguments": [],
    }
    assert sorted(plan.registered) == ["tell-joke", "tell-pun"] and plan.conflicts == []
    assert plan.owned == {
        key: value_hash(value) for key, value in plan.writes.items() if key[0] != "discovery" and value
    }
    record = OwnershipRecord.from_value(plan.writes[record_key("joke")])  # type: ignore[arg-type]
    assert record.owned == {
        "tool-service/joke": plan.owned[("tool-service", "joke")],
        "tool/tell-joke": plan.owned[("tool", "tell-joke")],
        "tool/tell-pun": plan.owned[("tool", "tell-pun")],
    }
    assert list(record.instances) == ["i1"] and record.digest == joke.digest


def test_the_same_offer_again_writes_nothing() -> None:
    joke = offer("joke", "tell-joke")
    first = converge({}, "joke", joke)
    view: dict[Key, str | None] = dict(first.writes)
    again = converge(view, "joke", joke, owned=first.owned)
    assert again.writes == {} and again.registered == [] and again.owned == first.owned


def test_a_static_tool_is_never_overwritten_and_is_reported() -> None:
    static = ToolDescriptor(name="tell-joke", description="by hand", service="joke").to_json()
    plan = converge({("tool", "tell-joke"): static}, "joke", offer("joke", "tell-joke", "tell-pun"))
    assert ("tool", "tell-joke") not in plan.writes and ("tool", "tell-joke") not in plan.owned
    assert [(c.tool, c.held_by) for c in plan.conflicts] == [("tell-joke", "static")]
    assert "static wins" in plan.conflicts[0].reason
    assert ("tool", "tell-pun") in plan.writes  # the rest of the offer still goes in


def test_a_static_item_already_holding_the_announced_value_is_used_but_never_owned() -> None:
    joke = offer("joke", "tell-joke")
    same = joke.items()[("tool", "tell-joke")]
    plan = converge({("tool", "tell-joke"): same}, "joke", joke)
    assert plan.conflicts == [] and ("tool", "tell-joke") not in plan.writes and ("tool", "tell-joke") not in plan.owned
    gone = converge({("tool", "tell-joke"): same}, "joke", None, owned=plan.owned, gone=True)
    assert ("tool", "tell-joke") not in gone.writes  # not ours: it stays when the service goes


def test_a_static_service_descriptor_with_other_queues_refuses_every_tool() -> None:
    other = ToolServiceDescriptor.model_validate(
        {
            "id": "joke",
            "request-queue": "non-persistent://tg/request/x",
            "response-queue": "non-persistent://tg/response/x",
        }
    ).to_json()
    plan = converge({("tool-service", "joke"): other}, "joke", offer("joke", "tell-joke", "tell-pun"))
    assert set(plan.writes) == {record_key("joke")} and plan.owned == {}
    assert sorted(c.tool for c in plan.conflicts) == ["tell-joke", "tell-pun"]
    assert all(c.held_by == "static" and "tool-service/joke" in c.reason for c in plan.conflicts)


def test_a_name_owned_by_another_service_stays_with_it() -> None:
    first = converge({}, "joke", offer("joke", "tell-joke"))
    view: dict[Key, str | None] = dict(first.writes)
    owners = {key: "joke" for key in first.owned}
    second = converge(view, "other", offer("other", "tell-joke", "other-tool"), owners=owners)
    assert ("tool", "tell-joke") not in second.writes
    assert [(c.tool, c.held_by) for c in second.conflicts] == [("tell-joke", "joke")]
    assert ("tool", "other-tool") in second.writes


def test_first_holder_wins_within_one_batch_in_plan_order() -> None:
    original: dict[Key, str | None] = {}
    view = dict(original)
    owners: dict[Key, str] = {}
    plans = []
    for service_id in ("first", "second"):
        plan = converge(view, service_id, offer(service_id, "shared"), owners=owners)
        apply_plan(view, owners, plan, [])
        plans.append(plan)
    assert owners[("tool", "shared")] == "first"
    assert [(c.tool, c.held_by) for c in plans[1].conflicts] == [("shared", "first")]
    puts, deletes, expect = combine(original, view, plans)
    assert ("tool", "shared", view[("tool", "shared")]) in puts and json.loads(view[("tool", "shared")])[
        "service"
    ] == "first"  # type: ignore[arg-type]
    assert deletes == [] and all(value is None for _, _, value in expect)


def test_a_departing_service_deletes_only_what_still_holds_its_values() -> None:
    joke = offer("joke", "tell-joke", "tell-pun")
    first = converge({}, "joke", joke)
    view: dict[Key, str | None] = dict(first.writes)
    operator = ToolDescriptor(name="tell-pun", description="edited by an operator", service="joke").to_json()
    view[("tool", "tell-pun")] = operator
    gone = converge(view, "joke", None, owned=first.owned, gone=True)
    assert gone.writes == {("tool-service", "joke"): None, ("tool", "tell-joke"): None, record_key("joke"): None}
    assert gone.removed == ["tell-joke"] and gone.record is None


def test_a_new_offer_without_a_tool_removes_that_tool() -> None:
    first = converge({}, "joke", offer("joke", "tell-joke", "tell-pun"))
    view: dict[Key, str | None] = dict(first.writes)
    second = converge(view, "joke", offer("joke", "tell-joke"), owned=first.owned)
    assert second.writes[("tool", "tell-pun")] is None and second.removed == ["tell-pun"]
    assert ("tool", "tell-joke") not in second.writes  # unchanged value: untouched


def test_an_owned_item_changed_by_an_operator_becomes_theirs() -> None:
    first = converge({}, "joke", offer("joke", "tell-joke"))
    view: dict[Key, str | None] = dict(first.writes)
    view[("tool", "tell-joke")] = ToolDescriptor(name="tell-joke", description="mine now", service="joke").to_json()
    again = converge(view, "joke", offer("joke", "tell-joke"), owned=first.owned)
    assert ("tool", "tell-joke") not in again.writes and ("tool", "tell-joke") not in again.owned
    assert [(c.tool, c.held_by) for c in again.conflicts] == [("tell-joke", "static")]


def test_without_descriptors_the_owned_keys_are_kept_and_the_record_refreshed() -> None:
    first = converge({}, "joke", offer("joke", "tell-joke"))
    view: dict[Key, str | None] = dict(first.writes)
    record = base_record("joke", "i1", "i2", digest=offer("joke", "tell-joke").digest)
    keep = plan_service(view, {}, service_id="joke", owned=first.owned, record=record, offer=None)
    assert set(keep.writes) == {record_key("joke")} and keep.owned == first.owned
    assert list(OwnershipRecord.from_value(keep.writes[record_key("joke")]).instances) == ["i1", "i2"]  # type: ignore[arg-type]


def test_combine_sends_final_values_so_a_handover_is_one_put() -> None:
    first = converge({}, "joke", offer("joke", "shared"))
    original: dict[Key, str | None] = dict(first.writes)
    view = dict(original)
    owners = {key: "joke" for key in first.owned}
    gone = converge(view, "joke", None, owned=first.owned, gone=True)
    apply_plan(view, owners, gone, first.owned)
    taker = converge(view, "other", offer("other", "shared"), owners=owners)
    apply_plan(view, owners, taker, [])
    puts, deletes, expect = combine(original, view, [gone, taker])
    shared = ("tool", "shared")
    assert [p for p in puts if (p[0], p[1]) == shared] == [("tool", "shared", view[shared])]
    assert shared not in deletes and ("tool", "shared", original[shared]) in expect
    assert ("tool-service", "joke") in deletes and owners[shared] == "other"


def test_combine_leaves_out_keys_that_end_where_they_started() -> None:
    key: Key = ("tool", "x")
    original: dict[Key, str | None] = {key: "v"}
    view = dict(original)
    from discovery.registry.merge import Plan

    plan = Plan(service="s", writes={key: "v"})
    assert combine(original, view, [plan]) == ([], [], [])


def test_ownership_record_round_trips() -> None:
    record = base_record("joke", "i1").model_copy(update={"owned": {"tool/x": "h"}})
    again = OwnershipRecord.from_value(record.to_value())
    assert again == record and again.owned_keys() == {("tool", "x"): "h"}

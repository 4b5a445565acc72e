"""Leases, expiry sweeps and the self-preservation decision (pure, no broker)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from discovery.registry.leases import LeaseTable, should_hold

A = ("default", "a")
B = ("default", "b")


def table(*services: tuple[str, str], ttl: float = 2.0, now: float = 0.0, **kwargs: float) -> LeaseTable:
    leases = LeaseTable(**kwargs)  # type: ignore[arg-type]
    for number, service in enumerate(services):
        leases.renew(f"{service[1]}-{number}", service, ttl=ttl, now=now, wall=1000.0, digest="d")
    return leases


def test_a_lease_lives_for_its_ttl_after_the_last_message() -> None:
    leases = table(A, ttl=2.0)
    assert leases.sweep(1.99).expired == []
    leases.renew("a-0", A, ttl=2.0, now=1.5, wall=1001.5)
    assert leases.sweep(3.4).expired == []
    result = leases.sweep(3.5)
    assert [lease.instance for lease in result.expired] == ["a-0"] and len(leases) == 0


def test_renew_reports_new_instances_and_keeps_the_known_digest() -> None:
    leases = LeaseTable()
    lease, created = leases.renew("i", A, ttl=1, now=0, wall=0, digest="d1", announced=4)
    assert created and lease.digest == "d1" and lease.announced == 4
    lease, created = leases.renew("i", A, ttl=1, now=0.5, wall=0.5)
    assert not created and lease.digest == "d1" and lease.announced == 4


def test_an_instance_that_names_another_service_moves_to_it() -> None:
    leases = LeaseTable()
    leases.renew("i", A, ttl=1, now=0, wall=0)
    _, created = leases.renew("i", B, ttl=1, now=0, wall=0)
    assert created and leases.of_service(A) == [] and [lease.instance for lease in leases.of_service(B)] == ["i"]


@pytest.mark.parametrize(
    ("failing", "total", "hold"),
    [
        (4, 4, True),  # everyone at once
        (3, 5, True),  # 60% > 50%
        (4, 8, False),  # exactly half is not "more than"
        (2, 2, False),  # one service's two instances: below the minimum of 3
        (1, 1, False),
        (0, 0, False),
    ],
)
def test_should_hold(failing: int, total: int, hold: bool) -> None:
    assert should_hold(failing, total, 0.5, 3) is hold


def test_most_leases_expiring_in_one_sweep_are_held_not_dropped() -> None:
    c = ("default", "c")
    leases = table(A, A, B, B, c)
    leases.renew("c-4", c, ttl=2.0, now=1.9, wall=1001)
    result = leases.sweep(2.0)
    assert result.expired == [] and len(result.held) == 4 and (result.failing, result.total) == (4, 5)
    assert result.share == pytest.approx(0.8)
    assert len(leases) == 5 and {lease.state for lease in leases.held()} == {"held"}
    # Held leases never expire on their own; while they are held, so is the next expiry.
    result = leases.sweep(3.9)
    assert [lease.instance for lease in result.held] == ["c-4"] and result.expired == []
    assert len(leases.held()) == 5


def test_leases_falling_silent_together_are_held_though_they_run_out_one_by_one() -> None:
    """Heartbeats are ttl/3 apart, so services that stop together run out over a third of a ttl."""
    services = [("default", name) for name in "abcd"]
    leases = LeaseTable()
    for number, service in enumerate(services):
        leases.renew(f"i{number}", service, ttl=3.0, now=number * 0.3, wall=0)  # last heartbeats 0.3 s apart
    held: list[str] = []
    now = 3.0
    while now < 4.0:
        result = leases.sweep(now)
        assert result.expired == []
        held += [lease.instance for lease in result.held]
        now += 0.1
    assert sorted(held) == ["i0", "i1", "i2", "i3"] and len(leases) == 4


def test_one_death_among_many_healthy_leases_is_removed_normally() -> None:
    services = [("default", f"s{n}") for n in range(6)]
    leases = LeaseTable()
    for number, service in enumerate(services):
        leases.renew(f"i{number}", service, ttl=3.0, now=0.0, wall=0)
    for number in range(1, 6):
        leases.renew(f"i{number}", services[number], ttl=3.0, now=2.5, wall=0)  # still heartbeating
    result = leases.sweep(3.0)
    assert [lease.instance for lease in result.expired] == ["i0"] and result.held == []


def test_a_small_deployment_is_removed_normally() -> None:
    leases = table(A, A)
    result = leases.sweep(5.0)
    assert len(result.expired) == 2 and result.held == [] and len(leases) == 0


def test_a_heard_from_held_instance_resumes_and_the_rest_get_one_more_ttl_then_expire_normally() -> None:
    leases = table(A, B, ("default", "c"), ("default", "d"), ttl=2.0)
    assert len(leases.sweep(2.0).held) == 4
    leases.renew("a-0", A, ttl=2.0, now=10.0, wall=1010)
    resumed = leases.resume_held(10.0)
    assert sorted(lease.instance for lease in resumed) == ["b-1", "c-2", "d-3"]
    assert leases.get("a-0").state == "live"  # type: ignore[union-attr]
    assert leases.sweep(11.9).expired == []
    leases.renew("a-0", A, ttl=2.0, now=11.9, wall=1011.9)  # a keeps heartbeating
    result = leases.sweep(12.0)
    # 3 of 4 at once would trip self-preservation again; released leases are exempt from it.
    assert sorted(lease.instance for lease in result.expired) == ["b-1", "c-2", "d-3"] and result.held == []
    assert [lease.instance for lease in leases] == ["a-0"]


def test_release_drops_the_held_leases_at_once() -> None:
    leases = table(A, B, ("default", "c"))
    leases.sweep(3.0)
    released = leases.release_held()
    assert len(released) == 3 and len(leases) == 0 and leases.held() == []


def test_restored_leases_are_in_grace_until_heard_from() -> None:
    leases = LeaseTable()
    lease = leases.restore("i", A, ttl=2.0, now=0.0, digest="d")
    assert lease.state == "grace" and lease.digest == "d" and lease.announced == 0
    assert lease.last_seen is None  # not heard from since the registry started: no made-up heartbeat
    leases.renew("i", A, ttl=2.0, now=1.0, wall=1.0)
    assert lease.state == "live" and lease.last_seen == 1.0


def test_restored_leases_expire_after_one_ttl() -> None:
    leases = LeaseTable()
    leases.restore("i", A, ttl=2.0, now=0.0, digest="d")
    assert leases.sweep(1.9).expired == []
    assert [lease.instance for lease in leases.sweep(2.0).expired] == ["i"]


def test_by_service_groups_leases() -> None:
    leases = table(A, A, B)
    grouped = leases.by_service()
    assert sorted(grouped) == [A, B] and len(grouped[A]) == 2 and len(grouped[B]) == 1


def test_refused_leases_run_out_and_are_never_held() -> None:
    """Four of five leases run out together, but their holders are sending refused messages: not silence."""
    leases = table(A, A, B, B, ("default", "c"))
    leases.renew("c-4", ("default", "c"), ttl=2.0, now=1.9, wall=1001)
    for instance in ("a-0", "a-1", "b-2", "b-3"):
        leases.refuse(instance, "not trusted: unsigned announcement (a trust policy is configured)")
    assert {lease.state for lease in leases if lease.instance != "c-4"} == {"refused"}
    result = leases.sweep(2.0)
    assert sorted(lease.instance for lease in result.expired) == ["a-0", "a-1", "b-2", "b-3"]
    assert result.held == [] and result.failing == 0 and [lease.instance for lease in leases] == ["c-4"]


def test_refused_leases_do_not_count_towards_holding_others() -> None:
    """Two silent leases among refused ones are two of five failing: below the share, they expire."""
    leases = table(A, A, B, B, ("default", "c"))
    for instance in ("a-0", "a-1", "b-2"):
        leases.refuse(instance, "not trusted")
    result = leases.sweep(2.0)
    assert len(result.expired) == 5 and result.held == [] and result.failing == 2


def test_a_held_lease_found_refused_goes_at_the_next_sweep() -> None:
    leases = table(A, B, ("default", "c"))
    assert len(leases.sweep(2.0).held) == 3
    leases.refuse("a-0", "not trusted")
    result = leases.sweep(2.1)
    assert [lease.instance for lease in result.expired] == ["a-0"] and len(leases.held()) == 2


def test_an_accepted_message_clears_the_refusal() -> None:
    leases = table(A)
    leases.refuse("a-0", "not trusted")
    lease, _ = leases.renew("a-0", A, ttl=2.0, now=1.0, wall=1001, sequence=7, signer="k1")
    assert (lease.state, lease.refused, lease.sequence, lease.signer) == ("live", None, 7, "k1")


def test_a_services_leases_stay_found_through_every_change() -> None:
    """`of_service` answers from an index kept in step, not a pass over the fleet: every way a lease goes or moves keeps
    it right."""
    c = ("default", "c")
    leases = table(A, A, B, c, ttl=2.0)
    leases.renew("c-3", B, ttl=2.0, now=0.0, wall=1000.0)  # moves from c to b
    assert leases.service_count() == 2 and not leases.has_service(c)
    assert sorted(lease.instance for lease in leases.of_service(B)) == ["b-2", "c-3"]
    leases.remove("a-0")
    assert [lease.instance for lease in leases.of_service(A)] == ["a-1"]
    leases.restore("r", c, ttl=1.0, now=0.0, digest="d")
    assert leases.has_service(c) and leases.service_count() == 3
    leases.renew("a-1", A, ttl=9.0, now=0.0, wall=1000.0)
    leases.renew("b-2", B, ttl=9.0, now=0.0, wall=1000.0)
    assert [lease.instance for lease in leases.sweep(1.0).expired] == ["r"] and not leases.has_service(c)
    assert [lease.instance for lease in leases.sweep(2.0).expired] == ["c-3"]
    assert leases.by_service() == {A: leases.of_service(A), B: leases.of_service(B)} and leases.service_count() == 2


def test_held_leases_leave_their_service_when_released() -> None:
    leases = table(A, A, B)
    assert leases.held() == []  # nothing ever held: no pass over the table needed to say so
    leases.sweep(3.0)
    assert len(leases.held()) == 3 and leases.service_count() == 2
    leases.release_held()
    assert leases.service_count() == 0 and leases.of_service(A) == [] and leases.held() == []


class _CountedPasses(dict):  # type: ignore[type-arg]
    """The table's leases, counting every pass over them."""

    passes = 0

    def values(self):  # type: ignore[no-untyped-def]
        type(self).passes += 1
        return super().values()


def test_a_sweep_with_nothing_due_makes_no_pass_over_the_fleet() -> None:
    leases = table(*[(("default", f"s{n}")) for n in range(2_000)], ttl=15.0)
    leases._leases = _CountedPasses(leases._leases)
    for tick in range(100):  # 25 s of sweeps every 0.25 s while heartbeats renew a 60th of the fleet each
        now = tick * 0.25
        for number in range(tick * 20 % 2_000, tick * 20 % 2_000 + 20):
            leases.renew(f"s{number}-{number}", ("default", f"s{number}"), ttl=15.0, now=now, wall=now)
        assert leases.sweep(min(now, 14.9)).expired == []
    assert _CountedPasses.passes == 0


def random_history(seed: int, steps: int = 3_000) -> Iterator[tuple[LeaseTable, float, bool]]:
    """Renewals, refusals, holds, resumptions and removals of 40 instances' leases in random order, the clock moving
    on between them; after each step the table, the time, and whether this step is the caller's turn to sweep
    (about a quarter of them)."""
    rng = random.Random(seed)
    leases = LeaseTable(threshold=0.5, minimum=3)
    now = 0.0
    names = [f"i{n}" for n in range(40)]
    for _ in range(steps):
        now += rng.choice((0.0, 0.01, 0.1, 0.5))
        action, name = rng.random(), rng.choice(names)
        if action < 0.55:
            leases.renew(name, ("default", rng.choice("abc")), ttl=rng.choice((1.0, 2.0, 3.0)), now=now, wall=now)
        elif action < 0.65:
            leases.refuse(name, "refused for the test")
        elif action < 0.7:
            leases.resume_held(now)
        elif action < 0.73:
            leases.remove(name)
        yield leases, now, action >= 0.73


def test_sweeps_expire_exactly_the_leases_a_full_pass_would_after_any_history() -> None:
    """Each sweep expires and holds what a pass over every lease finds due (its end come, and not held unless
    refused)."""
    for leases, now, sweeping in random_history(7):
        if sweeping:
            expected = sorted(
                lease.instance
                for lease in leases
                if lease.expires_at <= now and (not lease.held or lease.refused is not None)
            )
            result = leases.sweep(now)
            assert sorted(lease.instance for lease in [*result.expired, *result.held]) == expected
            assert all(leases.get(lease.instance) is None for lease in result.expired)


def test_the_next_due_lease_is_the_earliest_end_a_sweep_could_take_after_any_history() -> None:
    """The registry sleeps until `next_due` (`Expiry.due_at`), so it must never be later than the first lease a sweep
    would take: after every step of a random history (sweeps among them), `next_due` is the earliest end among the
    leases not held (or held and refused); none: infinity."""
    assert LeaseTable(threshold=0.5, minimum=3).next_due() == float("inf")
    for leases, now, sweeping in random_history(11):
        if sweeping:
            leases.sweep(now)
        takeable = [lease.expires_at for lease in leases if not lease.held or lease.refused is not None]
        assert leases.next_due() == min(takeable, default=float("inf"))

"""Runtime limits: a client's, an exec pattern's and a concurrency key's maximum in flight
and rate of starts, set and removed at runtime, never exceeded."""

from __future__ import annotations

import pytest

from dispatch.core import (
    Dispatcher,
    InvalidTransition,
    JobRecord,
    JobStatus,
    Limit,
    LimitRemoved,
    LimitScope,
    LimitSet,
    RejectCode,
    Rejected,
    check_invariants,
    event_from_dict,
    state_view,
)
from dispatch.core.checks import check_work_conserving
from dispatch.core.events import Event
from tests.unit.core.helpers import (
    T0,
    ack,
    assigned_ids,
    assignments,
    check_replay,
    make,
    request,
    types,
    worker,
)


def _running(core: Dispatcher, **match: str) -> list[str]:
    return sorted(
        job.id
        for job in core.jobs()
        if job.status is JobStatus.RUNNING
        and all(getattr(job, name) == value for name, value in match.items())
    )


def test_a_key_limit_runs_one_job_of_a_key_at_a_time_and_others_go_on() -> None:
    core = make()
    log: list[Event] = []
    log += core.set_limit("key", "account:*", T0, max_inflight=1, by="ops", reason="one each")
    log += worker(core, "w", credits=10)
    jobs = [("a1", "account:1"), ("a2", "account:1"), ("b1", "account:2"), ("n1", None)]
    events = core.submit_many([request(i, key=k) for i, k in jobs], T0)
    log += events
    # One of account:1, one of account:2, and the job without a key.
    assert sorted(assigned_ids(events)) == ["a1", "b1", "n1"]
    assert core.limit_view("key", "account:*") == {
        "scope": "key",
        "target": "account:*",
        "max_inflight": 1,
        "rate": None,
        "burst": None,
        "source": "runtime",
        "by": "ops",
        "reason": "one each",
        "at": T0,
        "inflight": None,
        "held": 1,
    }
    assert core.limit_view("key", "account:1") is None
    check_invariants(core)
    check_work_conserving(core)
    # a1 done: a2 starts, at once.
    first = next(e for e in assignments(events) if e.job_id == "a1")
    done = ack(core, first, T0 + 1)
    log += done
    assert types(done) == ["completed", "assigned"] and assigned_ids(done) == ["a2"]
    check_invariants(core)
    check_replay(core, log)


def test_an_exact_key_limit_beats_the_pattern_and_each_key_of_a_pattern_counts_alone() -> None:
    core = make()
    core.set_limit("key", "account:*", T0, max_inflight=1)
    core.set_limit("key", "account:vip", T0, max_inflight=3)
    worker(core, "w", credits=20)
    events = core.submit_many(
        [request(f"v{n}", key="account:vip") for n in range(5)]
        + [request(f"x{n}", key=f"account:{n % 2}") for n in range(4)],
        T0,
    )
    started = assigned_ids(events)
    assert len([j for j in started if j.startswith("v")]) == 3
    assert len([j for j in started if j.startswith("x")]) == 2  # account:0 and account:1
    assert core.limit_view("key", "account:vip")["inflight"] == 3  # type: ignore[index]


def test_a_client_limit_replaces_its_cap_at_runtime_and_its_removal_restores_it() -> None:
    core = make(default_cap=2)
    worker(core, "w", credits=20)
    events = core.submit_many([request(f"j{n}", client_id="acme") for n in range(6)], T0)
    assert len(assigned_ids(events)) == 2
    # Raised at runtime, without a restart: two more start at once.
    raised = core.set_limit("client", "acme", T0 + 1, max_inflight=4, by="ops")
    assert types(raised) == ["limit_set", "assigned", "assigned"]
    # Lowered: what runs goes on, nothing new starts until below the limit.
    assert core.set_limit("client", "acme", T0 + 2, max_inflight=1) == [
        LimitSet(epoch=0, at=T0 + 2, scope=LimitScope.CLIENT, target="acme", max_inflight=1)
    ]
    running = [e for e in assignments(events + raised)]
    for n, event in enumerate(running[:3]):
        assert assigned_ids(ack(core, event, T0 + 3 + n)) == []
    assert len(_running(core, client_id="acme")) == 1
    # Removed: the configured cap (2) again.
    removed = core.remove_limit("client", "acme", T0 + 10, by="ops")
    assert types(removed) == ["limit_removed", "assigned"]
    assert core.remove_limit("client", "acme", T0 + 11) == []
    check_invariants(core)


def test_a_client_rate_limit_spaces_its_starts_and_the_leader_is_woken_for_each() -> None:
    core = make()
    worker(core, "w", credits=100)
    core.set_limit("client", "acme", T0, rate=2.0, burst=3)
    events = core.submit_many([request(f"j{n}", client_id="acme") for n in range(20)], T0)
    events += core.submit_many([request(f"o{n}", client_id="other") for n in range(5)], T0)
    # The burst at once, and the other tenant is not held by acme's limit.
    assert len([j for j in assigned_ids(events) if j.startswith("j")]) == 3
    assert len([j for j in assigned_ids(events) if j.startswith("o")]) == 5
    starts: list[float] = []
    now = T0
    for _ in range(40):
        wake = core.next_timer_at()
        assert wake is not None and wake > now
        now = wake
        ticked = core.tick(now)
        starts += [e.at for e in assignments(ticked)]
        if len(starts) == 17:
            break
    # Then one start every 0.5 s, exactly when the next token is there.
    assert starts == pytest.approx([T0 + 0.5 * (n + 1) for n in range(17)])
    check_invariants(core)


def test_an_exec_limit_is_one_budget_over_every_exec_its_pattern_matches() -> None:
    core = make()
    worker(core, "w", credits=20)
    core.set_limit("exec", "image.>", T0, max_inflight=2)
    events = core.submit_many(
        [
            request("r1", "image.resize"),
            request("c1", "image.crop"),
            request("r2", "image.resize"),
            request("m1", "mail.send"),
        ],
        T0,
    )
    assert sorted(assigned_ids(events)) == ["c1", "m1", "r1"]
    assert core.limit_view("exec", "image.>")["held"] == 1  # type: ignore[index]
    done = ack(core, next(e for e in assignments(events) if e.job_id == "c1"), T0 + 1)
    assert assigned_ids(done) == ["r2"]
    check_invariants(core)
    check_work_conserving(core)


@pytest.mark.parametrize("start", [0.0, 1_700_000_000.0, 4_000_000_000.0])
def test_the_wake_up_for_a_token_starts_a_job_whatever_the_clock(start: float) -> None:
    """At unix times a float step is ~2e-7 s: the time asked for must be one at which the
    bucket has its token, or a leader (or a replay) would ask for it again forever."""
    core = make()
    worker(core, "w", credits=100, now=start)
    core.set_limit("client", "c", start, rate=50.0, burst=1)
    core.submit_many([request(f"j{n}", client_id="c") for n in range(4)], start)
    started = 1
    for _ in range(3):
        wake = core.next_timer_at()
        assert wake is not None
        started += len(assigned_ids(core.tick(wake)))
    assert started == 4


def test_a_timed_out_attempt_is_requeued_not_reassigned_when_its_limit_has_no_room() -> None:
    core = make(ack_timeout_s=5.0)
    worker(core, "w", credits=10)
    core.set_limit("client", "acme", T0, rate=0.1, burst=1)
    events = core.submit(request("j1", client_id="acme"), T0)
    assert assigned_ids(events) == ["j1"]
    timed_out = core.tick(T0 + 5)
    # No token for a new attempt: it waits in its queue for one (at T0 + 10).
    assert types(timed_out) == ["requeued"]
    assert assigned_ids(core.tick(T0 + 10)) == ["j1"]


def test_settings_give_defaults_that_a_runtime_limit_replaces_and_its_removal_restores() -> None:
    core = make(limits={"key": {"*": Limit(max_inflight=1)}})
    worker(core, "w", credits=10)
    events = core.submit_many([request(f"j{n}", key="k") for n in range(3)], T0)
    assert len(assigned_ids(events)) == 1
    assert [view["source"] for view in core.limit_views()] == ["settings"]
    assert len(assigned_ids(core.set_limit("key", "*", T0, max_inflight=3))) == 2
    assert [view["source"] for view in core.limit_views()] == ["runtime"]
    core.remove_limit("key", "*", T0 + 1)
    assert core.limit_view("key", "*")["max_inflight"] == 1  # type: ignore[index]


@pytest.mark.parametrize(
    ("scope", "target", "knobs", "field"),
    [
        ("zone", "x", {"max_inflight": 1}, "scope"),
        ("client", "", {"max_inflight": 1}, "client_id"),
        ("exec", "image..x", {"max_inflight": 1}, "exec"),
        ("exec", "a.>.b", {"max_inflight": 1}, "exec"),
        ("key", "a*b", {"max_inflight": 1}, "key"),
        ("key", "k" * 201, {"max_inflight": 1}, "key"),
        ("key", "k", {}, "max_inflight"),
        ("key", "k", {"max_inflight": 0}, "max_inflight"),
        ("key", "k", {"rate": 0}, "rate"),
        ("key", "k", {"rate": -1.0}, "rate"),
        ("key", "k", {"rate": 2e6}, "rate"),
        ("key", "k", {"burst": 3}, "burst"),
        ("key", "k", {"rate": 1.0, "burst": 0}, "burst"),
    ],
)
def test_a_bad_limit_is_refused_naming_the_field(
    scope: str, target: str, knobs: dict[str, float], field: str
) -> None:
    core = make()
    with pytest.raises(Rejected) as refused:
        core.set_limit(scope, target, T0, **knobs)  # type: ignore[arg-type]
    assert refused.value.code is RejectCode.INVALID
    assert refused.value.detail.startswith(field), refused.value.detail
    assert core.limits() == []


def test_a_bad_key_on_a_submission_is_refused_naming_the_field() -> None:
    for key in ["", "a*", "x" * 201, "tab\there", 42]:
        with pytest.raises(ValueError, match=r"^key"):
            request("j", key=key)


def test_limit_events_round_trip_and_a_removal_of_nothing_does_not_fold() -> None:
    event = LimitSet(
        epoch=2, at=T0, scope=LimitScope.EXEC, target="image.>", rate=2.5, burst=5, by="ops"
    )
    data = event.to_dict()
    assert data == {
        "type": "limit_set",
        "epoch": 2,
        "at": T0,
        "scope": "exec",
        "target": "image.>",
        "rate": 2.5,
        "burst": 5,
        "by": "ops",
    }
    assert event_from_dict(data) == event
    for bad, field in [
        ({**data, "target": "image..x"}, "limit_set.exec"),
        ({**data, "rate": None, "burst": None}, "limit_set.max_inflight"),
        ({**data, "scope": "key", "target": "a*b"}, "limit_set.key"),
    ]:
        with pytest.raises(ValueError, match=f"^{field}"):
            event_from_dict(bad)
    core = Dispatcher()
    removal = LimitRemoved(epoch=0, at=T0, scope=LimitScope.KEY, target="k")
    with pytest.raises(InvalidTransition):
        core.apply(removal)


def test_a_restore_keeps_the_limits_and_counts_and_starts_rate_buckets_empty() -> None:
    core = make()
    worker(core, "w", credits=10)
    core.set_limit("key", "k", T0, max_inflight=2)
    core.set_limit("client", "acme", T0, rate=1.0, burst=5)
    core.submit_many([request(f"j{n}", key="k") for n in range(3)], T0)
    restored = Dispatcher.restore(
        [JobRecord.from_dict(job.to_dict()) for job in core.jobs()],
        config=core.config,
        limits=core.limits(),
    )
    check_invariants(restored)
    assert state_view(restored)["limits"] == state_view(core)["limits"]
    assert restored.limit_view("key", "k")["inflight"] == 2  # type: ignore[index]
    restored.join("w", ["job.assign.>"], T0)
    restored.grant_credit("w", 10, T0)
    # The key is full: j2 waits. acme's bucket is empty at the snapshot's time (the starts
    # before it are unknown): its first job waits a token's time, not its burst.
    events = restored.submit(request("a1", client_id="acme"), T0)
    assert assigned_ids(events) == []
    assert assigned_ids(restored.tick(T0 + 1.0)) == ["a1"]

"""Retry delays: a failed or timed-out attempt waits its policy's delay before the next one."""

from __future__ import annotations

import pytest

from dispatch.core import (
    Dispatcher,
    JobRecord,
    Reassigned,
    RejectCode,
    Rejected,
    Requeued,
    RetryPolicy,
    SubmitRequest,
)
from dispatch.core.config import CoreConfig
from dispatch.core.job import next_attempt_at, public_status
from dispatch.core.reducer import fold_job_events
from tests.unit.core.helpers import T0, assigned_ids, assignments, make, request, types, worker

SLOW = RetryPolicy(delay_s=10.0, multiplier=3.0, max_delay_s=50.0)


def test_the_delay_grows_by_the_multiplier_up_to_the_maximum() -> None:
    delays = [SLOW.delay("j", attempt) for attempt in range(1, 6)]
    assert delays == [10.0, 30.0, 50.0, 50.0, 50.0]
    assert RetryPolicy().delay("j", 3) == 0.0  # the bare core's default: at once
    assert RetryPolicy(delay_s=1.0, max_delay_s=1e6).delay("j", 10_000) == 1e6  # no overflow


def test_jitter_is_drawn_from_the_job_and_attempt_within_its_share() -> None:
    policy = RetryPolicy(delay_s=100.0, multiplier=1.0, jitter=0.5)
    draws = {policy.delay(f"job-{n}", 1) for n in range(200)}
    assert all(50.0 <= delay <= 100.0 for delay in draws)
    assert len(draws) > 150, "jobs that failed together are spread out"
    # The same job and attempt always get the same delay: a replay draws the same times.
    assert policy.delay("job-7", 2) == policy.delay("job-7", 2)
    assert policy.delay("job-7", 2) != policy.delay("job-7", 3)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"delay_s": -1.0}, "retry.delay_s"),
        ({"multiplier": 0.5}, "retry.multiplier"),
        ({"max_delay_s": -2.0}, "retry.max_delay_s"),
        ({"jitter": 1.5}, "retry.jitter"),
        ({"delay": 1.0}, "delay"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(fields: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        SubmitRequest(id="a", exec="x", payload=None, retry=fields)


def test_a_retryable_failure_waits_its_delay_before_the_next_attempt() -> None:
    core = make(retry=SLOW)
    first = assignments(worker(core, "w", credits=5) + core.submit(request("a"), T0))[0]
    events = core.fail("a", 1, first.lease, T0 + 1, error="database down")
    assert types(events) == ["requeued"], "the free worker must not get it back at once"
    requeued = events[0]
    assert isinstance(requeued, Requeued) and requeued.not_before == T0 + 11
    job = core.job("a")
    assert job is not None and public_status(job) == "retrying"
    assert next_attempt_at(job) == T0 + 11
    assert core.next_timer_at() == T0 + 11, "the leader wakes up for it"
    assert core.tick(T0 + 10.9) == []
    second = assignments(core.tick(T0 + 11))
    assert [(event.job_id, event.attempt) for event in second] == [("a", 2)]
    # The second failure waits three times as long.
    events = core.fail("a", 2, second[0].lease, T0 + 12)
    assert isinstance(events[0], Requeued) and events[0].not_before == T0 + 12 + 30


def test_a_worker_may_ask_for_its_own_delay() -> None:
    core = make(retry=SLOW)
    first = assignments(worker(core, "w", credits=5) + core.submit(request("a"), T0))[0]
    events = core.fail("a", 1, first.lease, T0, retry_after_s=0.0)
    assert assigned_ids(events) == ["a"], "retry_after_s=0: again at once"
    second = assignments(events)[0]
    events = core.fail("a", 2, second.lease, T0 + 1, retry_after_s=120.0)
    assert isinstance(events[0], Requeued) and events[0].not_before == T0 + 121


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "soon", 1e12])
def test_a_bad_retry_after_is_refused_naming_it_and_changes_nothing(bad: object) -> None:
    core = make(retry=SLOW)
    first = assignments(worker(core, "w", credits=5) + core.submit(request("a"), T0))[0]
    with pytest.raises(Rejected) as refused:
        core.fail("a", 1, first.lease, T0, retry_after_s=bad)  # type: ignore[arg-type]
    assert refused.value.code is RejectCode.INVALID and "retry_after_s" in refused.value.detail
    job = core.job("a")
    assert job is not None and job.status.value == "running"


def test_a_timed_out_attempt_waits_its_delay_too() -> None:
    """A timeout is a failed attempt (Temporal's activity retries back off timeouts too)."""
    core = make(retry=SLOW, ack_timeout_s=5.0)
    worker(core, "w1", credits=1)
    worker(core, "w2", credits=1)
    core.submit(request("a"), T0)
    events = core.tick(T0 + 5)
    assert types(events) == ["requeued"], "not reassigned at once although w2 is free"
    requeued = events[0]
    assert isinstance(requeued, Requeued) and requeued.reason.value == "timeout"
    assert requeued.not_before == T0 + 15
    assert assigned_ids(core.tick(T0 + 15)) == ["a"]


def test_without_a_delay_a_timed_out_attempt_is_reassigned_at_once() -> None:
    core = make(retry=RetryPolicy(), ack_timeout_s=5.0)
    worker(core, "w1", credits=1)
    worker(core, "w2", credits=1)
    core.submit(request("a"), T0)
    events = core.tick(T0 + 5)
    assert [type(event) for event in events] == [Reassigned]


def test_a_lost_worker_s_job_is_requeued_at_once() -> None:
    core = make(retry=SLOW)
    worker(core, "w1", credits=1)
    core.submit(request("a"), T0)
    worker(core, "w2")
    events = core.lose_worker("w1", T0 + 1)
    requeued = events[0]
    assert isinstance(requeued, Requeued) and requeued.not_before is None
    assert assigned_ids(core.grant_credit("w2", 1, T0 + 1)) == ["a"]


def test_the_default_comes_from_the_first_matching_exec_pattern() -> None:
    config = CoreConfig(
        retry=SLOW,
        retry_by_exec=(
            ("mail.*", RetryPolicy(delay_s=1.0)),
            ("mail.>", RetryPolicy(delay_s=2.0)),
        ),
    )
    assert config.retry_for("mail.send").delay_s == 1.0
    assert config.retry_for("mail.send.bulk").delay_s == 2.0
    assert config.retry_for("image.resize") is SLOW
    with pytest.raises(ValueError, match="retry_by_exec"):
        CoreConfig(retry_by_exec=(("a.>.b", RetryPolicy()),))


def test_a_job_s_own_policy_is_completed_at_submit_and_kept_through_a_rebuild() -> None:
    core = make(retry=SLOW)
    core.submit(request("a", retry={"delay_s": 2.0}), T0)
    job = core.job("a")
    assert job is not None
    assert job.retry == RetryPolicy(delay_s=2.0, multiplier=3.0, max_delay_s=50.0)
    restored = Dispatcher.restore(
        [JobRecord.from_dict(job.to_dict())], config=CoreConfig(worker_expiry_s=None)
    )
    first = assignments(worker(restored, "w", credits=1, now=T0))[0]
    events = restored.fail("a", 1, first.lease, T0)
    assert isinstance(events[0], Requeued) and events[0].not_before == T0 + 2.0


def test_replaying_the_log_gives_the_same_retry_times() -> None:
    core = make(retry=RetryPolicy(delay_s=4.0, jitter=1.0))
    log = worker(core, "w", credits=5) + core.submit(request("a"), T0)
    first = assignments(log)[0]
    log += core.fail("a", 1, first.lease, T0 + 1)
    # Another configuration: folding never decides, it reads the time the event carries.
    replica = Dispatcher(CoreConfig(worker_expiry_s=None))
    replica.apply_all(log)
    assert replica.job("a") == core.job("a")
    folded = fold_job_events(None, log)
    assert folded is not None and folded.not_before == core.job("a").not_before  # type: ignore[union-attr]
    assert replica.next_timer_at() == core.next_timer_at()


def test_an_event_without_the_new_field_still_decodes_as_an_immediate_requeue() -> None:
    from dispatch.core.events import event_from_dict

    old = {
        "type": "requeued", "epoch": 1, "at": 5.0, "job_id": "a", "reason": "failed",
        "worker_id": "w", "attempt": 1, "error": "x", "seq": -1,
    }  # fmt: skip
    event = event_from_dict(old)
    assert isinstance(event, Requeued) and event.not_before is None
    assert event.to_dict() == old, "written exactly as before when there is no delay"


def test_a_first_delay_beyond_the_inherited_maximum_raises_it() -> None:
    assert SLOW.merged({"delay_s": 600.0}).delay("j", 1) == 600.0
    assert SLOW.merged({"delay_s": 600.0, "max_delay_s": 60.0}).delay("j", 1) == 60.0

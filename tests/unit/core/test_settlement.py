"""Settling assignments: ack with a result, fail with an error, heartbeat; idempotent repeats
and refusals of stale leases."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dispatch.core import (
    Assigned,
    Completed,
    DeadLettered,
    DeadReason,
    Dispatcher,
    Event,
    JobStatus,
    Reassigned,
    RejectCode,
    Rejected,
    Requeued,
    RequeueReason,
    state_view,
)
from tests.unit.core.helpers import (
    T0,
    ack,
    assignments,
    make,
    request,
    types,
    worker,
)


def test_ack_for_a_timed_out_attempt_is_refused() -> None:
    d = make(ack_timeout_s=10.0)
    worker(d, "w", credits=2)
    (first,) = assignments(d.submit(request("j1"), T0))
    (second,) = assignments(d.tick(T0 + 10))
    with pytest.raises(Rejected) as caught:
        ack(d, first, T0 + 11)
    assert caught.value.code is RejectCode.STALE_LEASE and caught.value.http_status == 409
    assert types(ack(d, second, T0 + 12, result="ok")) == ["completed"]


def test_ack_records_the_result() -> None:
    d = make()
    worker(d, "w", credits=1)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    events = ack(d, assigned, T0 + 3, result={"url": "s3://out"})
    (completed,) = events
    assert isinstance(completed, Completed) and completed.result == {"url": "s3://out"}
    job = d.job("j1")
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert job.result == {"url": "s3://out"} and job.updated_at == T0 + 3
    assert job.worker_id == "w" and job.deadline is None


def test_repeated_ack_is_idempotent() -> None:
    d = make()
    worker(d, "w", credits=1)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    ack(d, assigned, T0 + 1, result="first")
    assert ack(d, assigned, T0 + 2, result="second") == []
    assert d.job("j1").result == "first"  # type: ignore[union-attr]


def test_ack_with_a_wrong_lease_or_attempt_is_refused() -> None:
    d = make()
    worker(d, "w", credits=1)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    for attempt, lease in ((1, "bogus"), (2, assigned.lease)):
        with pytest.raises(Rejected) as caught:
            d.ack("j1", attempt, lease, T0)
        assert caught.value.code is RejectCode.STALE_LEASE and caught.value.job_id == "j1"
    with pytest.raises(Rejected) as wrong_worker:
        d.ack("j1", 1, assigned.lease, T0, worker_id="intruder")
    assert wrong_worker.value.code is RejectCode.STALE_LEASE
    assert d.job("j1").status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_ack_of_an_unknown_job_is_not_found() -> None:
    d = make()
    with pytest.raises(Rejected) as caught:
        d.ack("nope", 1, "0.1", T0)
    assert caught.value.code is RejectCode.NOT_FOUND and caught.value.http_status == 404


def test_ack_with_a_malformed_attempt_or_lease_is_invalid() -> None:
    d = make()
    for attempt, lease in ((0, "0.1"), (1, ""), (True, "0.1")):
        with pytest.raises(Rejected) as caught:
            d.ack("nope", attempt, lease, T0)
        assert caught.value.code is RejectCode.INVALID


def test_ack_after_the_job_was_dead_lettered_is_already_settled() -> None:
    d = make(max_attempts=1, ack_timeout_s=10.0)
    worker(d, "w", credits=1)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    d.tick(T0 + 10)
    with pytest.raises(Rejected) as caught:
        ack(d, assigned, T0 + 11)
    assert caught.value.code is RejectCode.ALREADY_SETTLED
    assert "ack_timeout" in caught.value.detail


def test_failure_records_the_error() -> None:
    d = make()
    worker(d, "w", credits=1)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    d.fail("j1", 1, assigned.lease, T0 + 1, error="disk full")
    assert d.job("j1").error == "disk full"  # type: ignore[union-attr]


def test_retryable_failure_requeues_for_the_next_attempt() -> None:
    d = make(max_attempts=3)
    worker(d, "w", credits=1)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    events = d.fail("j1", 1, assigned.lease, T0 + 1, error="flaky", retryable=True)
    (requeued,) = events
    assert isinstance(requeued, Requeued) and requeued.reason is RequeueReason.FAILED
    (again,) = assignments(d.grant_credit("w", 1, T0 + 2))
    assert again.attempt == 2


def test_retryable_failure_on_the_last_attempt_dead_letters() -> None:
    d = make(max_attempts=1)
    worker(d, "w", credits=1)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    (event,) = d.fail("j1", 1, assigned.lease, T0 + 1, error="flaky")
    assert isinstance(event, DeadLettered) and event.reason is DeadReason.RETRIES_EXHAUSTED


def test_permanent_failure_dead_letters_at_once() -> None:
    d = make(max_attempts=5)
    worker(d, "w", credits=1)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    (event,) = d.fail("j1", 1, assigned.lease, T0 + 1, error="bad input", retryable=False)
    assert isinstance(event, DeadLettered) and event.reason is DeadReason.PERMANENT_FAILURE
    job = d.job("j1")
    assert job is not None and job.status is JobStatus.DEAD and job.attempts == 1
    assert job.error == "bad input"


def test_repeated_permanent_failure_is_idempotent_but_a_late_ack_is_not() -> None:
    d = make()
    worker(d, "w", credits=1)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    d.fail("j1", 1, assigned.lease, T0 + 1, error="bad", retryable=False)
    assert d.fail("j1", 1, assigned.lease, T0 + 2, error="bad", retryable=False) == []
    with pytest.raises(Rejected) as caught:
        ack(d, assigned, T0 + 3)
    assert caught.value.code is RejectCode.ALREADY_SETTLED


def test_heartbeat_extends_the_deadline() -> None:
    d = make(ack_timeout_s=10.0)
    worker(d, "w", credits=2)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    (beat,) = d.heartbeat("j1", 1, assigned.lease, T0 + 8)
    assert beat.type == "job_heartbeat"
    assert d.job("j1").deadline == T0 + 18  # type: ignore[union-attr]
    assert d.tick(T0 + 15) == [], "the old deadline no longer applies"
    assert types(d.tick(T0 + 18)) == ["reassigned"]


def test_heartbeat_never_shortens_the_deadline() -> None:
    d = make(ack_timeout_s=10.0, backoff_multiplier=1.0)
    worker(d, "w", credits=1)
    (assigned,) = assignments(d.submit(request("j1", timeout_s=30.0), T0))
    d.heartbeat("j1", 1, assigned.lease, T0 + 1)
    assert d.job("j1").deadline == T0 + 31  # type: ignore[union-attr]


def test_heartbeat_with_a_stale_lease_is_rejected() -> None:
    d = make(ack_timeout_s=10.0)
    worker(d, "w", credits=1)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    with pytest.raises(Rejected) as caught:
        d.heartbeat("j1", 1, "0.999", T0 + 1)
    assert caught.value.code is RejectCode.STALE_LEASE
    ack(d, assigned, T0 + 2)
    with pytest.raises(Rejected) as settled:
        d.heartbeat("j1", 1, assigned.lease, T0 + 3)
    assert settled.value.code is RejectCode.ALREADY_SETTLED


def test_ack_many_settles_a_batch_and_reports_rejections() -> None:
    d = make()
    worker(d, "w", credits=3)
    a, b, c = assignments(d.submit_many([request("a"), request("b"), request("c")], T0))
    events, rejected = d.ack_many(
        [(a.job_id, 1, a.lease, "ra"), (b.job_id, 1, "bogus", None), (c.job_id, 1, c.lease, "rc")],
        T0 + 1,
    )
    assert types(events) == ["completed", "completed"]
    assert [(r.job_id, r.code) for r in rejected] == [("b", RejectCode.STALE_LEASE)]
    assert d.job("a").result == "ra"  # type: ignore[union-attr]


def test_ack_many_from_a_named_worker_settles_only_that_workers_assignments() -> None:
    d = make()
    worker(d, "w1", credits=1)
    worker(d, "w2", credits=1)
    mine, theirs = assignments(d.submit_many([request("a"), request("b")], T0))
    assert (mine.worker_id, theirs.worker_id) == ("w1", "w2")
    events, rejected = d.ack_many(
        [(mine.job_id, 1, mine.lease, "ok"), (theirs.job_id, 1, theirs.lease, "forged")],
        T0 + 1,
        worker_id="w1",
    )
    assert [event.job_id for event in events if isinstance(event, Completed)] == ["a"]
    assert [(r.job_id, r.code) for r in rejected] == [("b", RejectCode.STALE_LEASE)]
    assert d.job("b").status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_acks_count_as_signs_of_life() -> None:
    d = make(worker_expiry_s=15.0, ack_timeout_s=600.0)
    worker(d, "w", credits=2)
    first, _second = assignments(d.submit_many([request("j1"), request("j2")], T0))
    ack(d, first, T0 + 10)
    assert d.tick(T0 + 20) == []
    assert d.worker("w") is not None


# --- leases bound to the key of the worker that holds them -----------------------------------


def owned_job() -> tuple[Dispatcher, Assigned | Reassigned]:
    """Worker w1 of key k1 holds j1; worker w2 of key k2 is idle."""
    d = make()
    d.join("w1", ["job.assign.>"], T0, owner="k1")
    d.grant_credit("w1", 1, T0)
    d.join("w2", ["job.assign.>"], T0, owner="k2")
    (assigned,) = assignments(d.submit(request("j1"), T0))
    assert assigned.worker_id == "w1"
    return d, assigned


@pytest.mark.parametrize("command", ["ack", "ack_many", "fail", "heartbeat"])
def test_the_right_lease_from_another_key_is_refused_and_changes_nothing(command: str) -> None:
    d, assigned = owned_job()
    job_id, attempt, lease = assigned.job_id, assigned.attempt, assigned.lease
    before = state_view(d)
    settle: dict[str, Callable[[], object]] = {
        "ack": lambda: d.ack(job_id, attempt, lease, T0 + 1, owner="k2"),
        "fail": lambda: d.fail(job_id, attempt, lease, T0 + 1, retryable=False, owner="k2"),
        "heartbeat": lambda: d.heartbeat(job_id, attempt, lease, T0 + 1, owner="k2"),
    }
    if command == "ack_many":
        events, (rejection,) = d.ack_many([(job_id, attempt, lease, "x")], T0 + 1, owner="k2")
        assert events == []
    else:
        with pytest.raises(Rejected) as caught:
            settle[command]()
        rejection = caught.value
    assert rejection.code is RejectCode.STALE_LEASE and rejection.job_id == job_id
    # Worded as for a wrong lease: a prober learns neither the holder nor its attempt.
    assert "w1" not in rejection.detail and "held by" not in rejection.detail
    with pytest.raises(Rejected) as wrong_lease:
        d.ack(job_id, attempt, "0.guess", T0 + 1, owner="k2")
    assert wrong_lease.value.detail == rejection.detail.replace(repr(lease), repr("0.guess"))
    assert state_view(d) == before
    # The owner itself settles it.
    assert types(d.ack(job_id, attempt, lease, T0 + 2, owner="k1")) == ["completed"]


def test_another_key_naming_the_holder_as_its_worker_is_still_refused() -> None:
    d, assigned = owned_job()
    with pytest.raises(Rejected) as caught:
        ack_as(d, assigned, worker_id="w1", owner="k2")
    assert caught.value.code is RejectCode.STALE_LEASE
    with pytest.raises(Rejected) as other_worker:
        ack_as(d, assigned, worker_id="w2", owner="k1")
    assert other_worker.value.code is RejectCode.STALE_LEASE
    assert types(ack_as(d, assigned, worker_id="w1", owner="k1")) == ["completed"]
    # The idempotent repeat answers the owner, not another key.
    assert ack_as(d, assigned, worker_id="w1", owner="k1") == []
    with pytest.raises(Rejected) as repeat:
        ack_as(d, assigned, worker_id=None, owner="k2")
    assert repeat.value.code is RejectCode.STALE_LEASE


def test_an_admin_settles_without_an_owner_and_sees_the_holder() -> None:
    d, assigned = owned_job()
    with pytest.raises(Rejected) as caught:
        d.ack(assigned.job_id, assigned.attempt, "0.guess", T0 + 1)
    assert "held by attempt 1 by worker 'w1'" in caught.value.detail
    assert types(ack(d, assigned, T0 + 1)) == ["completed"]


def test_a_worker_with_no_known_owner_is_settled_by_its_lease() -> None:
    # A placeholder after a restore (or a worker an admin joined) has no recorded owner: the
    # lease, 128 random bits, is the proof, so the worker's resent acks are not lost.
    d = make()
    d.join("w1", ["job.assign.>"], T0)
    d.grant_credit("w1", 1, T0)
    (assigned,) = assignments(d.submit(request("j1"), T0))
    assert d.worker_owner("w1") is None
    assert types(ack_as(d, assigned, worker_id="w1", owner="k1")) == ["completed"]


def ack_as(
    d: Dispatcher, assigned: Assigned | Reassigned, *, worker_id: str | None, owner: str | None
) -> list[Event]:
    return d.ack(
        assigned.job_id, assigned.attempt, assigned.lease, T0 + 1, worker_id=worker_id, owner=owner
    )

"""Cancelling a running job: its worker is told to stop (`cancel_requested`), and the job ends
`cancelled` when the worker confirms (fails the attempt), when its grace passes, or when the
worker is lost; an ack before then still completes it. `cancel_where` cancels many."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from dispatch.core import (
    Cancelled,
    CancelRequested,
    Completed,
    Dispatcher,
    Event,
    InvalidTransition,
    JobRecord,
    JobStatus,
    RejectCode,
    Rejected,
    check_invariants,
    fold_job,
)
from dispatch.core.client_commands import MAX_CANCEL_BATCH, MAX_REASON_LENGTH
from dispatch.core.job import public_status
from tests.unit.core import helpers
from tests.unit.core.helpers import (
    T0,
    assigned_ids,
    request,
    types,
    worker,
)


class Run(helpers.Run):
    defaults: ClassVar[Mapping[str, Any]] = {"ack_timeout_s": 60.0, "cancel_grace_s": 10.0}


# --- cancel of one running job ---------------------------------------------------------------


def test_a_running_job_is_asked_to_stop_and_its_deadline_cut_to_the_grace() -> None:
    run = Run()
    assigned = run.start()
    assert assigned.deadline == T0 + 60
    (requested,) = run(run.core.cancel("j1", T0 + 5, by="ops", reason="wrong input"))
    assert requested == CancelRequested(
        epoch=0, at=T0 + 5, job_id="j1", worker_id="w", attempt=1, deadline=T0 + 15,
        by="ops", reason="wrong input",
    )  # fmt: skip
    job = run.job()
    assert job.status is JobStatus.RUNNING and job.deadline == T0 + 15
    assert job.cancel_requested_at == T0 + 5 and public_status(job) == "cancelling"
    assert run.core.next_timer_at() == T0 + 15
    run.check()


def test_a_deadline_sooner_than_the_grace_is_kept() -> None:
    run = Run(cancel_grace_s=100.0)
    run.start()
    (requested,) = run(run.core.cancel("j1", T0 + 5))
    assert isinstance(requested, CancelRequested) and requested.deadline == T0 + 60
    assert run.job().deadline == T0 + 60
    run.check()


def test_asking_again_changes_nothing() -> None:
    run = Run()
    run.start()
    run(run.core.cancel("j1", T0 + 1))
    assert run.core.cancel("j1", T0 + 2, reason="again") == []
    assert run.job().cancel_requested_at == T0 + 1 and run.job().deadline == T0 + 11


def test_heartbeats_do_not_extend_a_cancelling_job() -> None:
    run = Run()
    assigned = run.start()
    run(run.core.cancel("j1", T0 + 1))
    (beat,) = run(run.core.heartbeat("j1", 1, assigned.lease, T0 + 5))
    assert beat.deadline == T0 + 11  # type: ignore[attr-defined]
    assert run.job().deadline == T0 + 11
    run.check()


@pytest.mark.parametrize("retryable", [True, False])
def test_the_workers_failure_confirms_the_cancel(retryable: bool) -> None:
    run = Run()
    assigned = run.start(credits=2)
    run(run.core.submit(request("j2", client_id="other"), T0))  # also running on w
    run(run.core.cancel("j1", T0 + 1, by="ops", reason="stop"))
    run(run.core.submit(request("j3"), T0 + 1))  # waits: w has no credit left
    events = run(
        run.core.fail(
            "j1", 1, assigned.lease, T0 + 2, error="cancelled: cancel_requested",
            retryable=retryable,
        )
    )  # fmt: skip
    cancelled = events[0]
    assert isinstance(cancelled, Cancelled)
    assert (cancelled.worker_id, cancelled.attempt, cancelled.by) == ("w", 1, None)
    assert "the worker stopped" in cancelled.reason
    assert "cancelled: cancel_requested" in cancelled.reason
    job = run.job()
    assert job.status is JobStatus.CANCELLED and job.error == cancelled.reason
    assert (job.deadline, job.cancel_requested_at, job.run_limit_at) == (None, None, None)
    assert job.is_terminal and public_status(job) == "cancelled"
    # The slot is free: w runs only j2, and the client is under its cap again.
    w = run.core.worker("w")
    assert w is not None and w.running == ("j2",)
    assert run.core.inflight(job.client_id) == 0
    assert run.core.counts()["cancelled"] == 1 and run.core.counts()["running"] == 1
    run.check()


def test_the_freed_slot_takes_the_next_job_when_the_worker_has_credit() -> None:
    run = Run(default_cap=1)
    assigned = run.start(credits=2)
    run(run.core.submit(request("j2"), T0))  # waits: the client is at its cap
    run(run.core.cancel("j1", T0 + 1))
    events = run(run.core.fail("j1", 1, assigned.lease, T0 + 2, error="stopped"))
    assert types(events) == ["cancelled", "assigned"] and assigned_ids(events) == ["j2"]
    run.check()


def test_an_ack_while_cancelling_still_completes_the_job() -> None:
    run = Run()
    assigned = run.start()
    run(run.core.cancel("j1", T0 + 1))
    (completed,) = run(run.core.ack("j1", 1, assigned.lease, T0 + 2, result={"done": True}))
    assert isinstance(completed, Completed)
    job = run.job()
    assert job.status is JobStatus.SUCCEEDED and job.result == {"done": True}
    assert (job.deadline, job.cancel_requested_at) == (None, None)
    run.check()


def test_the_grace_passing_on_a_tick_cancels_the_job() -> None:
    run = Run()
    run.start()
    run(run.core.cancel("j1", T0 + 1, reason="stop"))
    assert run.core.tick(T0 + 10.9) == []
    (cancelled,) = run(run.core.tick(T0 + 11))
    assert isinstance(cancelled, Cancelled) and cancelled.at == T0 + 11
    assert (cancelled.worker_id, cancelled.attempt) == ("w", 1)
    assert "did not confirm" in cancelled.reason
    assert run.job().status is JobStatus.CANCELLED
    w = run.core.worker("w")
    assert w is not None and w.running == ()
    run.check()


def test_a_late_tick_on_the_last_attempt_still_cancels_rather_than_dead_letters() -> None:
    run = Run()
    run.start(max_attempts=1)
    run(run.core.cancel("j1", T0 + 1))
    assert types(run(run.core.tick(T0 + 500))) == ["cancelled"]
    run.check()


def test_losing_the_worker_cancels_the_job() -> None:
    run = Run()
    run.start()
    run(run.core.cancel("j1", T0 + 1))
    events = run(run.core.lose_worker("w", T0 + 2, reason="gone"))
    assert types(events) == ["cancelled", "worker_lost"]
    cancelled = events[0]
    assert isinstance(cancelled, Cancelled) and "gone" in cancelled.reason
    assert run.job().status is JobStatus.CANCELLED
    run.check()


@pytest.mark.parametrize("how", ["fail", "tick", "lose"])
@pytest.mark.parametrize("late", ["ack", "fail", "heartbeat"])
def test_a_late_settlement_after_the_cancel_is_already_settled(how: str, late: str) -> None:
    run = Run()
    assigned = run.start()
    run(run.core.cancel("j1", T0 + 1))
    if how == "fail":
        run(run.core.fail("j1", 1, assigned.lease, T0 + 2))
    elif how == "tick":
        run(run.core.tick(T0 + 20))
    else:
        run(run.core.lose_worker("w", T0 + 2))
    assert run.job().status is JobStatus.CANCELLED
    settle = getattr(run.core, late)
    with pytest.raises(Rejected) as caught:
        settle("j1", 1, assigned.lease, T0 + 30)
    assert caught.value.code is RejectCode.ALREADY_SETTLED and caught.value.http_status == 409
    run.check()


def test_a_finished_job_is_not_cancellable_and_an_unknown_one_not_found() -> None:
    run = Run()
    assigned = run.start()
    run(run.core.ack("j1", 1, assigned.lease, T0))
    with pytest.raises(Rejected) as caught:
        run.core.cancel("j1", T0)
    assert caught.value.code is RejectCode.NOT_CANCELLABLE
    with pytest.raises(Rejected) as caught:
        run.core.cancel("nope", T0)
    assert caught.value.code is RejectCode.NOT_FOUND


def test_who_asked_and_why_are_recorded_for_a_queued_job_too() -> None:
    run = Run()
    run(run.core.submit(request("q"), T0))
    (cancelled,) = run(run.core.cancel("q", T0 + 1, by="ops", reason="duplicate"))
    assert isinstance(cancelled, Cancelled)
    assert (cancelled.by, cancelled.reason, cancelled.worker_id) == ("ops", "duplicate", None)
    assert cancelled.to_dict() == {
        "type": "cancelled", "epoch": 0, "at": T0 + 1, "job_id": "q", "by": "ops",
        "reason": "duplicate",
    }  # fmt: skip
    assert run.job("q").error == "duplicate"
    run.check()


@pytest.mark.parametrize("reason", ["x" * (MAX_REASON_LENGTH + 1), 7, None])
def test_a_bad_reason_is_invalid_and_changes_nothing(reason: Any) -> None:
    run = Run()
    run.start()
    run(run.core.submit(request("q"), T0))
    for job_id in ("j1", "q"):
        with pytest.raises(Rejected) as caught:
            run.core.cancel(job_id, T0 + 1, reason=reason)
        assert caught.value.code is RejectCode.INVALID and "reason" in caught.value.detail
    with pytest.raises(Rejected) as caught:
        run.core.cancel_where(T0 + 1, reason=reason)
    assert caught.value.code is RejectCode.INVALID
    assert run.job().cancel_requested_at is None and run.job("q").status is JobStatus.QUEUED
    run(run.core.cancel("j1", T0 + 1, reason="x" * MAX_REASON_LENGTH))  # the longest allowed


# --- the fold ---------------------------------------------------------------------------------


def test_the_reducer_refuses_a_second_request_and_a_cancel_of_another_attempt() -> None:
    run = Run()
    run.start()
    (requested,) = run(run.core.cancel("j1", T0 + 1))
    job = run.job()
    with pytest.raises(InvalidTransition):
        fold_job(job, requested)
    stale = Cancelled(epoch=0, at=T0 + 2, job_id="j1", worker_id="w", attempt=2)
    with pytest.raises(InvalidTransition):
        fold_job(job, stale)
    confirmed = Cancelled(epoch=0, at=T0 + 2, job_id="j1", worker_id="w", attempt=1)
    folded = fold_job(job, confirmed)
    assert folded is not None and folded.status is JobStatus.CANCELLED
    assert job.status is JobStatus.RUNNING, "fold_job does not mutate its input"


def test_a_restored_cancelling_job_keeps_its_request_and_grace() -> None:
    run = Run()
    assigned = run.start()
    run(run.core.cancel("j1", T0 + 1))
    records = [JobRecord.from_dict(job.to_dict()) for job in run.core.jobs()]
    assert records[0].cancel_requested_at == T0 + 1
    restored = Dispatcher.restore(records, config=run.core.config)
    check_invariants(restored)
    (beat,) = restored.heartbeat("j1", 1, assigned.lease, T0 + 5)
    assert beat.deadline == T0 + 11  # type: ignore[attr-defined]
    assert types(restored.tick(T0 + 11)) == ["cancelled"]


# --- cancel_where -----------------------------------------------------------------------------


def _mixed() -> Run:
    """Running: r1 (image.resize, acme), r2 (mail.send, beta). Queued, in submission
    order: q1 (image.resize, acme), q2 (image.crop, beta), q3 (mail.send, acme), q4
    (image.resize, beta)."""
    run = Run(default_cap=10)
    run(worker(run.core, "w", credits=2))
    run(run.core.submit(request("r1", client_id="acme"), T0))
    run(run.core.submit(request("r2", "mail.send", client_id="beta"), T0 + 1))
    run(run.core.submit(request("q1", client_id="acme"), T0 + 2))
    run(run.core.submit(request("q2", "image.crop", client_id="beta"), T0 + 3))
    run(run.core.submit(request("q3", "mail.send", client_id="acme"), T0 + 4))
    run(run.core.submit(request("q4", client_id="beta"), T0 + 5))
    assert {job.id for job in run.core.jobs() if job.status is JobStatus.RUNNING} == {"r1", "r2"}
    return run


def _cancelled(events: list[Event]) -> list[tuple[str, str]]:
    return [(event.type, event.job_id) for event in events]  # type: ignore[attr-defined]


def test_cancel_where_cancels_queued_and_running_jobs_oldest_first() -> None:
    run = _mixed()
    events = run(run.core.cancel_where(T0 + 10, by="admin", reason="purge"))
    assert _cancelled(events) == [
        ("cancel_requested", "r1"), ("cancel_requested", "r2"), ("cancelled", "q1"),
        ("cancelled", "q2"), ("cancelled", "q3"), ("cancelled", "q4"),
    ]  # fmt: skip
    assert all(e.by == "admin" and e.reason == "purge" for e in events)  # type: ignore[attr-defined]
    assert run.core.cancel_where(T0 + 11) == [], "cancelling jobs are skipped"
    run.check()


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"exec_pattern": "image.*"}, ["r1", "q1", "q2", "q4"]),
        ({"exec_pattern": "image.resize"}, ["r1", "q1", "q4"]),
        ({"exec_pattern": ">"}, ["r1", "r2", "q1", "q2", "q3", "q4"]),
        ({"exec_pattern": "mail.>"}, ["r2", "q3"]),
        ({"client_id": "acme"}, ["r1", "q1", "q3"]),
        ({"client_id": "nobody"}, []),
        ({"statuses": frozenset({JobStatus.QUEUED})}, ["q1", "q2", "q3", "q4"]),
        ({"statuses": frozenset({JobStatus.RUNNING})}, ["r1", "r2"]),
        ({"exec_pattern": "image.*", "client_id": "beta"}, ["q2", "q4"]),
        ({"limit": 3}, ["r1", "r2", "q1"]),
        ({"limit": 1, "statuses": frozenset({JobStatus.QUEUED})}, ["q1"]),
    ],
)
def test_cancel_where_filters(filters: dict[str, Any], expected: list[str]) -> None:
    run = _mixed()
    events = run(run.core.cancel_where(T0 + 10, **filters))
    assert [event.job_id for event in events] == expected  # type: ignore[attr-defined]
    for event in events:
        job = run.job(event.job_id)  # type: ignore[attr-defined]
        if isinstance(event, CancelRequested):
            assert job.status is JobStatus.RUNNING and job.cancel_requested_at == T0 + 10
        else:
            assert isinstance(event, Cancelled) and job.status is JobStatus.CANCELLED
    run.check()


def test_cancel_where_skips_cancelling_jobs_without_counting_them() -> None:
    run = _mixed()
    run(run.core.cancel("r1", T0 + 6))
    events = run(run.core.cancel_where(T0 + 10, limit=2))
    assert [event.job_id for event in events] == ["r2", "q1"]  # type: ignore[attr-defined]
    assert run.job("r1").cancel_requested_at == T0 + 6, "its request stays the first one"
    run.check()


def test_cancel_where_passes_finished_jobs_by() -> None:
    run = _mixed()
    r1 = run.job("r1")
    run(run.core.ack("r1", 1, r1.lease or "", T0 + 6))
    events = run(run.core.cancel_where(T0 + 10, exec_pattern="image.resize"))
    # q1 was assigned when r1's slot freed up; q4 still waits.
    assert run.job("r1").status is JobStatus.SUCCEEDED
    assert "r1" not in [event.job_id for event in events]  # type: ignore[attr-defined]
    run.check()


@pytest.mark.parametrize(
    "arguments",
    [
        {"exec_pattern": "img..x"},
        {"exec_pattern": ""},
        {"limit": 0},
        {"limit": MAX_CANCEL_BATCH + 1},
        {"limit": True},
        {"limit": 2.0},
        {"statuses": frozenset()},
        {"statuses": frozenset({JobStatus.DEAD})},
        {"statuses": frozenset({JobStatus.QUEUED, JobStatus.SUCCEEDED})},
    ],
)
def test_cancel_where_refuses_bad_filters(arguments: dict[str, Any]) -> None:
    run = _mixed()
    with pytest.raises(Rejected) as caught:
        run.core.cancel_where(T0 + 10, **arguments)
    assert caught.value.code is RejectCode.INVALID and caught.value.http_status == 422
    assert run.core.counts()["cancelled"] == 0


@pytest.mark.parametrize("by", ["", 7, "k" * 129])
def test_a_bad_by_is_invalid(by: Any) -> None:
    """An empty name would not survive the event's round trip (an unset `by` is left out)."""
    run = Run()
    run.start()
    run(run.core.submit(request("q"), T0))
    for job_id in ("j1", "q"):
        with pytest.raises(Rejected) as caught:
            run.core.cancel(job_id, T0 + 1, by=by)
        assert caught.value.code is RejectCode.INVALID and "by" in caught.value.detail
    with pytest.raises(Rejected) as caught:
        run.core.cancel_where(T0 + 1, by=by)
    assert caught.value.code is RejectCode.INVALID
    assert run.core.counts()["cancelled"] == 0 and run.job().cancel_requested_at is None

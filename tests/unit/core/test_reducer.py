"""The per-job reducer: every lifecycle transition, purity, and refusals."""

from __future__ import annotations

import pytest

from dispatch.core import (
    Assigned,
    Cancelled,
    Completed,
    DeadLettered,
    DeadReason,
    Enqueued,
    Event,
    InvalidTransition,
    JobHeartbeat,
    JobRecord,
    JobStatus,
    Reassigned,
    Redriven,
    Requeued,
    RequeueReason,
    WorkerJoined,
    apply_job_event,
    fold_job,
    fold_job_events,
)

ENQUEUED = Enqueued(
    epoch=1,
    at=10.0,
    job_id="j1",
    client_id="acme",
    exec="image.resize",
    payload={"n": 1},
    max_attempts=2,
    timeout_s=30.0,
    priority=1,
    not_before=None,
    seq=5,
)
ASSIGNED = Assigned(
    epoch=1, at=11.0, job_id="j1", worker_id="w1", attempt=1, lease="1.1", deadline=41.0
)


def queued() -> JobRecord:
    job = fold_job(None, ENQUEUED)
    assert job is not None
    return job


def running() -> JobRecord:
    job = fold_job(queued(), ASSIGNED)
    assert job is not None
    return job


def test_enqueued_creates_a_queued_record() -> None:
    job = queued()
    assert (job.id, job.status, job.attempts, job.seq) == ("j1", JobStatus.QUEUED, 0, 5)
    assert job.submitted_at == job.updated_at == 10.0 and job.priority == 1


def test_assigned_starts_an_attempt() -> None:
    job = running()
    assert (job.status, job.attempts, job.worker_id, job.lease, job.deadline) == (
        JobStatus.RUNNING,
        1,
        "w1",
        "1.1",
        41.0,
    )


def test_reassigned_moves_the_job_and_counts_an_attempt() -> None:
    job = fold_job(
        running(),
        Reassigned(
            epoch=1,
            at=41.0,
            job_id="j1",
            worker_id="w2",
            previous_worker_id="w1",
            attempt=2,
            lease="1.2",
            deadline=101.0,
        ),
    )
    assert job is not None and (job.worker_id, job.attempts, job.lease) == ("w2", 2, "1.2")


def test_heartbeat_moves_the_deadline() -> None:
    beat = JobHeartbeat(
        epoch=1, at=20.0, job_id="j1", worker_id="w1", attempt=1, lease="1.1", deadline=50.0
    )
    job = fold_job(running(), beat)
    assert job is not None and job.deadline == 50.0 and job.updated_at == 20.0


def test_completed_records_the_result_and_clears_old_errors() -> None:
    job = running()
    job.error = "earlier"
    done = fold_job(
        job,
        Completed(epoch=1, at=12.0, job_id="j1", worker_id="w1", attempt=1, lease="1.1", result=7),
    )
    assert done is not None and done.status is JobStatus.SUCCEEDED and done.result == 7
    assert done.error is None and done.deadline is None and done.lease == "1.1"


def test_requeued_goes_back_to_queued_with_the_error() -> None:
    event = Requeued(
        epoch=1,
        at=12.0,
        job_id="j1",
        reason=RequeueReason.FAILED,
        worker_id="w1",
        attempt=1,
        error="flaky",
        seq=-1,
    )
    job = fold_job(running(), event)
    assert job is not None and job.status is JobStatus.QUEUED and job.worker_id is None
    assert (job.error, job.seq, job.attempts) == ("flaky", -1, 1)


def test_dead_lettered_records_reason_and_error() -> None:
    event = DeadLettered(
        epoch=1,
        at=12.0,
        job_id="j1",
        reason=DeadReason.PERMANENT_FAILURE,
        worker_id="w1",
        attempt=1,
        error="bad",
    )
    job = fold_job(running(), event)
    assert job is not None and job.status is JobStatus.DEAD
    assert (job.dead_reason, job.error) == (DeadReason.PERMANENT_FAILURE, "bad")


def test_cancelled_and_redriven() -> None:
    job = fold_job(queued(), Cancelled(epoch=1, at=12.0, job_id="j1"))
    assert job is not None and job.status is JobStatus.CANCELLED
    dead = fold_job(
        running(),
        DeadLettered(
            epoch=1, at=12.0, job_id="j1", reason=DeadReason.ACK_TIMEOUT, worker_id="w1", attempt=1
        ),
    )
    again = fold_job(dead, Redriven(epoch=1, at=13.0, job_id="j1", seq=9))
    assert again is not None and again.status is JobStatus.QUEUED
    assert (again.attempts, again.dead_reason, again.lease, again.seq) == (0, None, None, 9)


def test_fold_job_never_mutates_its_input() -> None:
    job = queued()
    before = job.to_dict()
    fold_job(job, ASSIGNED)
    assert job.to_dict() == before


def test_apply_job_event_mutates_in_place() -> None:
    job = queued()
    assert apply_job_event(job, ASSIGNED) is job and job.status is JobStatus.RUNNING


def test_non_job_events_pass_through() -> None:
    job = queued()
    assert fold_job(job, WorkerJoined(epoch=1, at=1.0, worker_id="w", subjects=("a",))) is job
    assert fold_job(None, WorkerJoined(epoch=1, at=1.0, worker_id="w", subjects=("a",))) is None


def test_fold_job_events_folds_a_batch_in_order() -> None:
    events: list[Event] = [
        ENQUEUED,
        ASSIGNED,
        Completed(
            epoch=1, at=12.0, job_id="j1", worker_id="w1", attempt=1, lease="1.1", result="ok"
        ),
    ]
    job = fold_job_events(None, events)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    # Folding in two micro-batches gives the same row.
    assert fold_job_events(fold_job_events(None, events[:1]), events[1:]) == job


def test_a_pruned_job_submitted_again_starts_a_new_life() -> None:
    done = fold_job_events(
        None,
        [
            ENQUEUED,
            ASSIGNED,
            Completed(epoch=1, at=12.0, job_id="j1", worker_id="w1", attempt=1, lease="1.1"),
        ],
    )
    again = fold_job(done, ENQUEUED)
    assert again is not None and again.status is JobStatus.QUEUED and again.result is None


@pytest.mark.parametrize(
    ("job", "event", "message"),
    [
        (None, ASSIGNED, "unknown job"),
        ("queued", ENQUEUED, "already exists"),
        ("running", ASSIGNED, "expected a queued job"),
        (
            "queued",
            Assigned(
                epoch=1, at=1.0, job_id="j1", worker_id="w", attempt=2, lease="x", deadline=2.0
            ),
            "attempt 2 after 0",
        ),
        (
            "running",
            Completed(epoch=1, at=1.0, job_id="j1", worker_id="w1", attempt=1, lease="other"),
            "lease mismatch",
        ),
        (
            "running",
            Completed(epoch=1, at=1.0, job_id="j1", worker_id="w9", attempt=1, lease="1.1"),
            "not the current attempt",
        ),
        ("queued", Cancelled(epoch=1, at=1.0, job_id="other"), "applied to the record of job 'j1'"),
        ("running", Cancelled(epoch=1, at=1.0, job_id="j1"), "expected a queued job"),
        ("running", Redriven(epoch=1, at=1.0, job_id="j1", seq=1), "expected a dead job"),
    ],
)
def test_impossible_transitions_are_refused(job: str | None, event: Event, message: str) -> None:
    record = {"queued": queued, "running": running}[job]() if job else None
    before = None if record is None else record.to_dict()
    with pytest.raises(InvalidTransition, match=message):
        fold_job(record, event)
    assert (None if record is None else record.to_dict()) == before


def test_requeue_without_attempts_left_is_refused() -> None:
    job = running()
    job.attempts = job.max_attempts = 2
    event = Requeued(
        epoch=1,
        at=12.0,
        job_id="j1",
        reason=RequeueReason.FAILED,
        worker_id="w1",
        attempt=2,
        seq=-1,
    )
    with pytest.raises(InvalidTransition, match="no attempts left"):
        fold_job(job, event)

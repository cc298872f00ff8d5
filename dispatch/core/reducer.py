"""The per-job lifecycle reducer: job state + job event -> job state.

This is the only place where a job changes status. The scheduler folds every job event
through `apply_job_event` (in place, for speed); the Spark fold calls `fold_job` /
`fold_job_events` (pure: inputs are never mutated) per job over a micro-batch's events in log
order and MERGEs the result into the Delta `jobs` table. Same code, so the leader and the
tables cannot disagree about a job.

Transitions (anything else raises InvalidTransition):

    (none)    --enqueued-->        queued       (also over a succeeded/cancelled record:
                                                  a pruned id submitted again starts anew)
    queued    --assigned-->        running      attempts += 1
    running   --reassigned-->      running      attempts += 1, new worker/lease/deadline
    running   --job_heartbeat-->   running      deadline extended
    running   --cancel_requested-> running      cancel_requested_at set, deadline cut
    running   --completed-->       succeeded    result recorded
    running   --requeued-->        queued       error and retry time (`not_before`) recorded
    running   --dead_lettered-->   dead         dead_reason and error recorded
    queued    --cancelled-->       cancelled
    running   --cancelled-->       cancelled    (its current attempt: the worker stopped)
    queued    --expired-->         expired      reason recorded as the error
    dead      --redriven-->        queued       attempts reset to 0, expiry cleared
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dispatch.core.errors import InvalidTransition
from dispatch.core.events import (
    Assigned,
    Cancelled,
    CancelRequested,
    Completed,
    DeadLettered,
    Enqueued,
    Event,
    Expired,
    JobEvent,
    JobHeartbeat,
    Reassigned,
    Redriven,
    Requeued,
)
from dispatch.core.job import JobRecord, JobStatus

_QUEUED = JobStatus.QUEUED
_RUNNING = JobStatus.RUNNING
_CANCELLED = JobStatus.CANCELLED
_EXPIRED = JobStatus.EXPIRED


def _refuse(job: JobRecord | None, event: JobEvent, why: str) -> InvalidTransition:
    state = "absent" if job is None else job.status.value
    return InvalidTransition(f"{event.type} for job {event.job_id!r} ({state}): {why}")


def _expect(job: JobRecord | None, event: JobEvent, status: JobStatus) -> JobRecord:
    if job is None:
        raise _refuse(job, event, "unknown job")
    if job.status is not status:
        raise _refuse(job, event, f"expected a {status.value} job")
    return job


def _expect_current(
    job: JobRecord | None, event: JobEvent, worker_id: str, attempt: int
) -> JobRecord:
    """The event settles or extends the job's current assignment."""
    job = _expect(job, event, _RUNNING)
    if attempt != job.attempts or worker_id != job.worker_id:
        raise _refuse(
            job,
            event,
            f"attempt {attempt} by {worker_id!r} is not the current attempt "
            f"{job.attempts} by {job.worker_id!r}",
        )
    return job


def enqueued(job: JobRecord | None, event: Enqueued) -> JobRecord:
    # A succeeded, cancelled or expired job the leader has pruned may be submitted again:
    # its new life replaces the old record. Anything else means the leader broke dedup.
    if (
        job is not None
        and job.status is not JobStatus.SUCCEEDED
        and job.status is not _CANCELLED
        and job.status is not _EXPIRED
    ):
        raise _refuse(job, event, "the job already exists")
    # Positional: a job is created per submission, and this is twice as fast as keywords.
    record = JobRecord(
        event.job_id,
        event.client_id,
        event.exec,
        event.payload,
        event.max_attempts,
        event.timeout_s,
        event.at,  # submitted_at
        event.at,  # updated_at
        event.seq,
        _QUEUED,
        0,  # attempts
        event.priority,
        event.not_before,
    )
    if event.retry is not None:
        record.retry = event.retry
    if event.expires_at is not None:
        record.expires_at = event.expires_at
    if event.max_run_s is not None:
        record.max_run_s = event.max_run_s
    if event.key is not None:
        record.key = event.key
    return record


def assigned(job: JobRecord | None, event: Assigned) -> JobRecord:
    attempt = event.attempt
    if (
        job is None
        or job.status is not _QUEUED
        or attempt != job.attempts + 1
        or attempt > job.max_attempts
    ):
        job = _expect(job, event, _QUEUED)
        raise _refuse(job, event, f"attempt {attempt} after {job.attempts} of {job.max_attempts}")
    job.status = _RUNNING
    job.attempts = attempt
    job.worker_id = event.worker_id
    job.lease = event.lease
    job.deadline = event.deadline
    job.updated_at = event.at
    if job.max_run_s is not None:
        job.run_limit_at = event.at + job.max_run_s
    return job


def reassigned(job: JobRecord | None, event: Reassigned) -> JobRecord:
    job = _expect_current(job, event, event.previous_worker_id, event.attempt - 1)
    if event.attempt > job.max_attempts:
        raise _refuse(job, event, f"attempt {event.attempt} exceeds {job.max_attempts}")
    job.attempts = event.attempt
    job.worker_id = event.worker_id
    job.lease = event.lease
    job.deadline = event.deadline
    job.updated_at = event.at
    job.progress = None
    if job.max_run_s is not None:
        job.run_limit_at = event.at + job.max_run_s
    return job


def job_heartbeat(job: JobRecord | None, event: JobHeartbeat) -> JobRecord:
    job = _expect_current(job, event, event.worker_id, event.attempt)
    if event.lease != job.lease:
        raise _refuse(job, event, "lease mismatch")
    job.deadline = event.deadline
    job.updated_at = event.at
    if event.progress is not None:
        job.progress = {**event.progress, "at": event.at}
    return job


def completed(job: JobRecord | None, event: Completed) -> JobRecord:
    if (
        job is None
        or job.status is not _RUNNING
        or event.attempt != job.attempts
        or event.worker_id != job.worker_id
        or event.lease != job.lease
    ):
        job = _expect_current(job, event, event.worker_id, event.attempt)
        raise _refuse(job, event, "lease mismatch")
    job.status = JobStatus.SUCCEEDED
    job.result = event.result
    # An earlier attempt's error would contradict the outcome a user reads.
    job.error = None
    job.deadline = None
    job.updated_at = event.at
    if job.run_limit_at is not None or job.cancel_requested_at is not None:
        _end_attempt(job)
    return job


def _end_attempt(job: JobRecord) -> None:
    """Clear what only a running attempt has."""
    job.deadline = None
    job.run_limit_at = None
    job.cancel_requested_at = None


def requeued(job: JobRecord | None, event: Requeued) -> JobRecord:
    job = _expect_current(job, event, event.worker_id, event.attempt)
    if job.attempts >= job.max_attempts:
        raise _refuse(job, event, "no attempts left: the job must be dead-lettered")
    job.status = _QUEUED
    job.worker_id = None
    _end_attempt(job)
    # The next attempt starts from nothing: a stale "70 %" would mislead.
    job.progress = None
    job.error = event.error
    job.seq = event.seq
    # The retry delay decided (None: runnable at once; a submission's own delay is spent).
    job.not_before = event.not_before
    job.updated_at = event.at
    return job


def dead_lettered(job: JobRecord | None, event: DeadLettered) -> JobRecord:
    job = _expect_current(job, event, event.worker_id, event.attempt)
    job.status = JobStatus.DEAD
    job.dead_reason = event.reason
    job.error = event.error
    _end_attempt(job)
    job.updated_at = event.at
    return job


def cancel_requested(job: JobRecord | None, event: CancelRequested) -> JobRecord:
    job = _expect_current(job, event, event.worker_id, event.attempt)
    if job.cancel_requested_at is not None:
        raise _refuse(job, event, "a cancel was already requested")
    job.cancel_requested_at = event.at
    # What a user reads while it stops, and the start of its final reason (`cancel_reason`).
    job.error = cancel_reason(event.reason)
    job.deadline = event.deadline
    job.updated_at = event.at
    return job


def cancel_reason(asked: str) -> str:
    """The error a cancelled running job shows from its cancel on: why it was asked."""
    return f"cancelled while running: {asked}" if asked else "cancelled while running"


def cancelled(job: JobRecord | None, event: Cancelled) -> JobRecord:
    if event.worker_id is None:
        job = _expect(job, event, _QUEUED)
    else:
        job = _expect_current(job, event, event.worker_id, event.attempt or 0)
        _end_attempt(job)
    job.status = JobStatus.CANCELLED
    if event.reason:
        job.error = event.reason
    job.updated_at = event.at
    return job


def expired(job: JobRecord | None, event: Expired) -> JobRecord:
    job = _expect(job, event, _QUEUED)
    job.status = _EXPIRED
    job.error = event.reason or None
    job.updated_at = event.at
    return job


def redriven(job: JobRecord | None, event: Redriven) -> JobRecord:
    job = _expect(job, event, JobStatus.DEAD)
    job.status = _QUEUED
    # An operator's redrive overrides the submitter's deadline: the job runs again.
    job.expires_at = None
    job.not_before = None
    job.progress = None
    job.attempts = 0
    job.dead_reason = None
    job.error = None
    job.worker_id = None
    job.lease = None
    job.seq = event.seq
    job.updated_at = event.at
    return job


# The transitions above are public so the scheduler can call the one it needs directly on
# its hot paths; `apply_job_event` dispatches on the event type to the same functions.
_Transition = Callable[[JobRecord | None, JobEvent], JobRecord]
TRANSITIONS: dict[type[JobEvent], _Transition] = {
    Enqueued: enqueued,  # type: ignore[dict-item]
    Assigned: assigned,  # type: ignore[dict-item]
    Reassigned: reassigned,  # type: ignore[dict-item]
    JobHeartbeat: job_heartbeat,  # type: ignore[dict-item]
    Completed: completed,  # type: ignore[dict-item]
    Requeued: requeued,  # type: ignore[dict-item]
    DeadLettered: dead_lettered,  # type: ignore[dict-item]
    CancelRequested: cancel_requested,  # type: ignore[dict-item]
    Cancelled: cancelled,  # type: ignore[dict-item]
    Expired: expired,  # type: ignore[dict-item]
    Redriven: redriven,  # type: ignore[dict-item]
}
"""The transition of each job event type. Each mutates and returns its record (or, for
`enqueued`, returns a new one)."""


def apply_job_event(job: JobRecord | None, event: JobEvent) -> JobRecord:
    """Fold one job event into `job` IN PLACE and return the record (new for `enqueued`).

    Raises InvalidTransition when the event does not fit the job's state; the record is then
    unchanged (every check happens before the first assignment).
    """
    if job is not None and job.id != event.job_id:
        raise _refuse(job, event, f"applied to the record of job {job.id!r}")
    transition = TRANSITIONS.get(type(event))
    if transition is None:
        raise _refuse(job, event, "not a job lifecycle event")
    return transition(job, event)


def fold_job(job: JobRecord | None, event: Event) -> JobRecord | None:
    """Pure: the job's record after `event`. `job` is never mutated.

    Events that are not about a job (worker, leader and prune events) return `job` unchanged,
    so a caller may pass a mixed stream. None in, `enqueued` event: the new record.
    """
    if not isinstance(event, JobEvent):
        return job
    return apply_job_event(None if job is None else job.copy(), event)


def fold_job_events(job: JobRecord | None, events: Iterable[Event]) -> JobRecord | None:
    """Pure: fold many events (one job's, in log order) into `job`, copying it once."""
    current = None if job is None else job.copy()
    for event in events:
        if isinstance(event, JobEvent):
            current = apply_job_event(current, event)
    return current

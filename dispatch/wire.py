"""The wire contract of a job, a submission's acceptance and an assignment: the JSON shapes
the server sends and the SDKs read, defined once.

The server answers with these models (`response_model=` of the routes, so they make the
OpenAPI document) and pushes what `job_view_of` and `assignment_of` encode (the WebSocket
`result`, `assign` and `assign_many` messages, the REST poll); the client SDK reads them
with the same models (`dispatch.client.Job` is `JobView`), and the worker SDK's
`worker.Assignment` is `Assignment` plus the id of the worker that received it.

Encoders are dict builders, not model instances: they run on the leader's loop thread for
every assignment and finished job, where building and dumping a model would cost several
times more. `tests/unit/test_wire.py` holds them to the models.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dispatch.core.job import TERMINAL_STATUSES, JobRecord, next_attempt_at, public_status


class _Answer(BaseModel):
    # Fields a newer server adds must not break an older SDK; answers are values.
    model_config = ConfigDict(extra="ignore", frozen=True)


class _SentInFull(_Answer):
    """A shape whose every field the server always sends. The defaults below serve only
    readers (an SDK user building one by hand, a field an older server lacked); the OpenAPI
    document still says every field is required."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


class Accepted(_Answer):
    """A submission Kafka holds (`202`), or the existing job of a known id (`200`)."""

    id: str
    status: str
    existing: bool = Field(False, description="True if this id was already known")
    warning: str | None = Field(
        None,
        description="Set when no connected worker serves the job's exec now: the job waits "
        "until one does",
    )


class AcceptedBatch(_Answer):
    jobs: list[Accepted]


class JobView(_SentInFull):
    """A job as the API shows it: status, attempts, result or error. Never its lease token
    (a worker's secret). Times are epoch seconds."""

    id: str
    client_id: str
    exec: str
    payload: Any = None
    status: str = Field(
        description="queued, retrying (queued again after an attempt that failed, timed out "
        "or lost its worker; see next_attempt_at), running, cancelling (running, its worker "
        "told to stop), succeeded, dead, cancelled or expired"
    )
    attempts: int
    max_attempts: int
    timeout_s: float
    priority: int = 0
    not_before: float | None = None
    worker_id: str | None = None
    deadline: float | None = None
    submitted_at: float
    updated_at: float
    result: Any = None
    error: str | None = None
    dead_reason: str | None = None
    next_attempt_at: float | None = Field(
        None,
        description="Retrying: the earliest time of its next attempt (null: as soon as a "
        "worker is free)",
    )
    expires_at: float | None = Field(
        None, description="A job still queued at this time ends expired (null: never)"
    )
    max_run_s: float | None = Field(
        None, description="Hard time limit of each attempt, in seconds (null: none)"
    )
    run_limit_at: float | None = Field(
        None, description="Running: when the current attempt reaches max_run_s and is stopped"
    )
    cancel_requested_at: float | None = Field(
        None, description="Cancelling: when the cancel was asked for"
    )
    progress: dict[str, Any] | None = Field(
        None,
        description="The latest progress its worker reported for the current attempt: "
        "{done, total, message, at} (null: none)",
    )
    key: str | None = Field(
        None, description="Its concurrency key, which the key limits apply to (null: none)"
    )

    @property
    def terminal(self) -> bool:
        """Succeeded, dead, cancelled or expired: the job will not change unless redriven."""
        return self.status in TERMINAL_STATUSES


class JobList(_Answer):
    jobs: list[JobView]


class Assignment(_SentInFull):
    """One attempt at a job, as the leader hands it to a worker. `deadline` is the leader's
    clock (epoch seconds); `attempt` and `lease` settle it."""

    id: str
    exec: str
    payload: Any = None
    attempt: int
    deadline: float
    lease: str


class StopAttempt(_Answer):
    """An attempt a worker holds and must stop (WebSocket `cancel`; REST poll `cancel`)."""

    id: str
    attempt: int
    reason: str = Field(
        description="cancel_requested (a client cancelled the job: stop and fail the "
        "attempt to confirm), time_limit (the attempt reached max_run_s) or ended (the "
        "attempt is no longer this worker's)"
    )


CANCEL_REQUESTED = "cancel_requested"
TIME_LIMIT = "time_limit"
ENDED = "ended"


class Assignments(_Answer):
    assignments: list[Assignment]
    epoch: int | None = None
    """The leader epoch that answered (a worker sends it back with its next poll)."""
    cancel: list[StopAttempt] = Field(
        default_factory=list, description="Attempts of the poll's `held` that must stop"
    )


_JOB_VIEW_FIELDS = tuple(JobView.model_fields)


def job_view_of(job: JobRecord) -> dict[str, Any]:
    """The `JobView` of a core record, as JSON-able values: the record without its lease
    token and queue position."""
    record = job.to_dict()
    record["status"] = public_status(job)
    record["next_attempt_at"] = next_attempt_at(job)
    record["expires_at"] = job.expires_at
    record["max_run_s"] = job.max_run_s
    record["run_limit_at"] = job.run_limit_at
    record["cancel_requested_at"] = job.cancel_requested_at
    record["progress"] = job.progress
    record["key"] = job.key
    return {name: record[name] for name in _JOB_VIEW_FIELDS}


def assignment_of(job: JobRecord) -> dict[str, Any]:
    """The `Assignment` of a running job's current attempt."""
    if job.lease is None or job.deadline is None:
        raise ValueError(f"job {job.id!r} is {job.status.value}: only a running job is assigned")
    return {
        "id": job.id,
        "exec": job.exec,
        "payload": job.payload,
        "attempt": job.attempts,
        "deadline": job.deadline,
        "lease": job.lease,
    }

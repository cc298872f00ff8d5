"""The per-job record: one row of the Delta `jobs` table, and the core's unit of state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from dispatch.core import _validate as v
from dispatch.core.keys import check_key
from dispatch.core.progress import stored_progress
from dispatch.core.retry import RetryPolicy
from dispatch.core.subjects import validate_exec

PRIORITY_MIN = -1_000_000
PRIORITY_MAX = 1_000_000


class JobStatus(StrEnum):
    QUEUED = "queued"
    """Waiting for a worker (ready, or delayed until `not_before`)."""
    RUNNING = "running"
    """Assigned to `worker_id` under `lease` until `deadline`."""
    SUCCEEDED = "succeeded"
    """Acked; `result` holds the worker's result. Terminal."""
    DEAD = "dead"
    """In the dead-letter queue; `dead_reason` says why. Can be redriven."""
    CANCELLED = "cancelled"
    """Cancelled while queued, or while running once its worker stopped (or its grace to
    stop passed). Terminal."""
    EXPIRED = "expired"
    """Still queued at its `expires_at`: it never ran (again). Terminal."""


TERMINAL_STATUSES = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.CANCELLED, JobStatus.DEAD, JobStatus.EXPIRED}
)
"""Statuses a job leaves only by redrive (dead) or never (succeeded, cancelled, expired)."""

RETRYING = "retrying"
"""The status the API shows for a queued job that has run before: it waits for its next
attempt (at `not_before`, its `next_attempt_at`, if the attempt failed with a delay). The
core keeps such a job `queued`: it is queued in every way (cancellable, expirable, taken in
queue order); only what a user reads tells it apart (`public_status`)."""


CANCELLING = "cancelling"
"""The status the API shows for a running job whose cancel was asked for: its worker has
been told to stop, and the job ends `cancelled` when it confirms or its grace passes. The
core keeps it `running` (it still holds its worker's slot)."""


def public_status(job: JobRecord) -> str:
    """The status a user reads: the core's, except `retrying` (see RETRYING) and
    `cancelling` (see CANCELLING)."""
    if job.status is JobStatus.QUEUED and job.attempts > 0:
        return RETRYING
    if job.cancel_requested_at is not None and job.status is JobStatus.RUNNING:
        return CANCELLING
    return job.status.value


def next_attempt_at(job: JobRecord) -> float | None:
    """When a retrying job may run its next attempt (None: as soon as a worker is free)."""
    if job.status is JobStatus.QUEUED and job.attempts > 0:
        return job.not_before
    return None


class DeadReason(StrEnum):
    """Why a job went to the dead-letter queue."""

    ACK_TIMEOUT = "ack_timeout"
    """Its last allowed attempt passed its deadline without an ack."""
    RETRIES_EXHAUSTED = "retries_exhausted"
    """Its last allowed attempt failed with a retryable error."""
    PERMANENT_FAILURE = "permanent_failure"
    """A worker reported a permanent (non-retryable) failure."""
    WORKER_LOST = "worker_lost"
    """The worker running its last allowed attempt was lost."""
    TIME_LIMIT = "time_limit"
    """Its last allowed attempt ran for its whole `max_run_s`."""


class RequeueReason(StrEnum):
    """Why a running job went back to its queue."""

    FAILED = "failed"
    """The worker reported a retryable failure."""
    WORKER_LOST = "worker_lost"
    """The worker disconnected or stopped heartbeating."""
    TIMEOUT = "timeout"
    """Its deadline passed and no matching worker could take it at once."""
    TIME_LIMIT = "time_limit"
    """The attempt ran for its whole `max_run_s` (heartbeats do not extend that)."""


@dataclass(slots=True)
class JobRecord:
    """Everything known about one job. `to_dict()` is the Delta row / snapshot format.

    Mutable for speed: the scheduler folds events into its records in place. Records handed
    out by `Dispatcher.job()` are copies; `fold_job` never mutates its input. Construct it
    with keywords: the field order is only relied upon inside the core (positional calls are
    more than twice as fast, and a job is created per submission).
    """

    id: str
    client_id: str
    exec: str
    payload: Any
    """Opaque JSON value, handed to the worker as is."""
    max_attempts: int
    timeout_s: float
    """Ack timeout of attempt 1; later attempts back off (see `CoreConfig.ack_timeout`)."""
    submitted_at: float
    updated_at: float
    seq: int
    """Queue position within (exec, priority, client): lower runs first. Requeued jobs get a
    negative seq so they run before anything submitted later."""
    status: JobStatus = JobStatus.QUEUED
    attempts: int = 0
    """Number of the latest attempt (0 = never assigned). Reset to 0 by redrive."""
    priority: int = 0
    not_before: float | None = None
    worker_id: str | None = None
    """The worker holding the job (running), or that ran its last attempt (succeeded, dead)."""
    lease: str | None = None
    """Token of the latest assignment; the worker presents it with attempt to settle the job."""
    deadline: float | None = None
    """Ack deadline of the current attempt (running only)."""
    result: Any = None
    error: str | None = None
    """The latest error (failure text, timeout, worker loss)."""
    dead_reason: DeadReason | None = None
    retry: RetryPolicy | None = None
    """The job's own retry policy; None: its exec's default (`CoreConfig.retry_for`) when a
    delay is decided."""
    expires_at: float | None = None
    """A queued job still not started at this time ends `expired` (None: never)."""
    max_run_s: float | None = None
    """Hard time limit of each attempt: heartbeats cannot carry one past it (None: none)."""
    run_limit_at: float | None = None
    """Running: when the current attempt reaches `max_run_s` (None: no limit)."""
    cancel_requested_at: float | None = None
    """Running: when a cancel was asked for (the worker was told to stop); None: never."""
    progress: dict[str, Any] | None = None
    """The latest progress its worker reported for the current attempt (`{done, total,
    message, at}`; see `dispatch.core.progress`), kept once the job ends; None: none."""
    key: str | None = None
    """The job's concurrency key (see `dispatch.core.limits`); None: none."""

    def copy(self) -> JobRecord:
        return JobRecord(
            self.id,
            self.client_id,
            self.exec,
            self.payload,
            self.max_attempts,
            self.timeout_s,
            self.submitted_at,
            self.updated_at,
            self.seq,
            self.status,
            self.attempts,
            self.priority,
            self.not_before,
            self.worker_id,
            self.lease,
            self.deadline,
            self.result,
            self.error,
            self.dead_reason,
            self.retry,
            self.expires_at,
            self.max_run_s,
            self.run_limit_at,
            self.cancel_requested_at,
            self.progress,
            self.key,
        )

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of JSON-able values (status and dead_reason as strings). `retry` and
        the fields added after it (`_LATER_FIELDS`) are left out when unset: a record of a
        job that uses none of them is written exactly as before they existed."""
        out: dict[str, Any] = {
            "id": self.id,
            "client_id": self.client_id,
            "exec": self.exec,
            "payload": self.payload,
            "status": self.status.value,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "timeout_s": self.timeout_s,
            "priority": self.priority,
            "not_before": self.not_before,
            "worker_id": self.worker_id,
            "lease": self.lease,
            "deadline": self.deadline,
            "submitted_at": self.submitted_at,
            "updated_at": self.updated_at,
            "result": self.result,
            "error": self.error,
            "dead_reason": None if self.dead_reason is None else self.dead_reason.value,
            "seq": self.seq,
        }
        if self.retry is not None:
            out["retry"] = self.retry.to_dict()
        for name in _LATER_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobRecord:
        """Rebuild a record from `to_dict()` output (e.g. a Delta row), checking every field
        and the consistency of the status with the other fields."""
        where = "job"
        v.check_keys(data, _FIELD_NAMES, where)

        def get(name: str, default: Any = v._MISSING) -> Any:
            return v.field_value(data, name, where, default)

        record = cls(
            id=v.as_id(get("id"), "job.id"),
            client_id=v.as_id(get("client_id"), "job.client_id"),
            exec=_exec(get("exec"), "job.exec"),
            payload=get("payload", None),
            status=v.as_enum(JobStatus, get("status"), "job.status"),
            attempts=v.as_int(get("attempts"), "job.attempts", minimum=0),
            max_attempts=v.as_int(get("max_attempts"), "job.max_attempts", minimum=1),
            timeout_s=v.as_number(get("timeout_s"), "job.timeout_s", positive=True),
            priority=v.as_int(get("priority", 0), "job.priority", PRIORITY_MIN, PRIORITY_MAX),
            not_before=v.as_opt_number(get("not_before", None), "job.not_before"),
            worker_id=v.as_opt_id(get("worker_id", None), "job.worker_id"),
            lease=v.as_opt_str(get("lease", None), "job.lease"),
            deadline=v.as_opt_number(get("deadline", None), "job.deadline"),
            submitted_at=v.as_number(get("submitted_at"), "job.submitted_at"),
            updated_at=v.as_number(get("updated_at"), "job.updated_at"),
            result=get("result", None),
            error=v.as_opt_str(get("error", None), "job.error"),
            dead_reason=v.as_opt_enum(DeadReason, get("dead_reason", None), "job.dead_reason"),
            seq=v.as_int(get("seq"), "job.seq"),
            retry=_opt_retry(get("retry", None)),
            expires_at=v.as_opt_number(get("expires_at", None), "job.expires_at"),
            max_run_s=_opt_positive(get("max_run_s", None), "job.max_run_s"),
            run_limit_at=v.as_opt_number(get("run_limit_at", None), "job.run_limit_at"),
            cancel_requested_at=v.as_opt_number(
                get("cancel_requested_at", None), "job.cancel_requested_at"
            ),
            progress=stored_progress(get("progress", None)),
            key=_opt_key(get("key", None)),
        )
        check_record(record)
        return record


_FIELD_NAMES = frozenset(f.name for f in fields(JobRecord))
_LATER_FIELDS = (
    "expires_at",
    "max_run_s",
    "run_limit_at",
    "cancel_requested_at",
    "progress",
    "key",
)
"""Optional fields added after the first Delta tables: left out of `to_dict` when unset."""


def _opt_positive(value: Any, label: str) -> float | None:
    return None if value is None else float(v.as_number(value, label, positive=True))


def _opt_key(value: Any) -> str | None:
    return None if value is None else check_key(value, "job.key")


def _opt_retry(value: Any) -> RetryPolicy | None:
    if value is None:
        return None
    if isinstance(value, RetryPolicy):
        return value
    return RetryPolicy.from_dict(value, "job.retry")


def _exec(value: Any, label: str) -> str:
    try:
        return validate_exec(value)
    except ValueError as error:
        raise ValueError(f"{label}: {error}") from None


def check_record(job: JobRecord) -> None:
    """Raise ValueError when the record's fields contradict its status."""
    label = f"job {job.id!r}"
    if job.attempts > job.max_attempts:
        raise ValueError(
            f"{label}.attempts: {job.attempts} exceeds max_attempts {job.max_attempts}"
        )
    running = job.status is JobStatus.RUNNING
    if running:
        if job.attempts < 1:
            raise ValueError(f"{label}.attempts: a running job has attempts >= 1")
        for name in ("worker_id", "lease", "deadline"):
            if getattr(job, name) is None:
                raise ValueError(f"{label}.{name}: required while running")
    else:
        for name in ("deadline", "run_limit_at", "cancel_requested_at"):
            if getattr(job, name) is not None:
                raise ValueError(f"{label}.{name}: only a running job has one")
    if job.status is JobStatus.QUEUED:
        if job.attempts >= job.max_attempts:
            raise ValueError(f"{label}.attempts: a queued job has attempts left")
        if job.worker_id is not None:
            raise ValueError(f"{label}.worker_id: a queued job has no worker")
    if (job.status is JobStatus.DEAD) != (job.dead_reason is not None):
        raise ValueError(f"{label}.dead_reason: set exactly when the job is dead")

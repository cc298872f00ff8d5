"""Request and response bodies of the REST contract (they make the OpenAPI document).

The shapes the SDKs read too (a job, an acceptance, an assignment) are in `dispatch.wire`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dispatch.core._validate import ID_PATTERN, ID_RULE
from dispatch.core.bounds import MAX_ID_LENGTH, MAX_JSON_DEPTH
from dispatch.core.commands import (
    MAX_ATTEMPTS_LIMIT,
    MAX_DELAY_S,
    MAX_EXEC_LENGTH,
    MAX_KEY_LENGTH,
    MAX_TIMEOUT_S,
)
from dispatch.core.job import PRIORITY_MAX, PRIORITY_MIN
from dispatch.core.limits import MAX_BURST, MAX_INFLIGHT, MAX_LIMIT_REASON, MAX_RATE
from dispatch.core.progress import MAX_PROGRESS_MESSAGE, MAX_PROGRESS_NUMBER
from dispatch.core.retry import MAX_RETRY_DELAY_S

_EXEC_PATTERN = r"^[^.\s*>]+(\.[^.\s*>]+)*$"
"""An exec name as `dispatch.core.subjects` reads it: dotted tokens, no wildcard or space."""


class _Body(BaseModel):
    # An unknown field is a client bug (a typo such as `max_attempt`): refuse it, naming it.
    model_config = ConfigDict(extra="forbid")


class RetrySubmission(_Body):
    """A job's own retry policy; a field left out takes its exec's default (settings,
    `[dispatcher]` `retry_*`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    delay_s: float | None = Field(
        None,
        description="Delay after the first failed attempt",
        json_schema_extra={"minimum": 0, "maximum": MAX_RETRY_DELAY_S},
    )
    multiplier: float | None = Field(
        None,
        description="Each delay is this many times the previous",
        json_schema_extra={"minimum": 1},
    )
    max_delay_s: float | None = Field(
        None,
        description="No delay is longer",
        json_schema_extra={"minimum": 0, "maximum": MAX_RETRY_DELAY_S},
    )
    jitter: float | None = Field(
        None,
        description="A delay d is drawn in [d * (1 - jitter), d], fixed by the job id and attempt",
        json_schema_extra={"minimum": 0, "maximum": 1},
    )


class JobSubmission(_Body):
    """One job. The constraints below are documentation: `SubmitRequest` checks every field
    (the same checks as a `dispatch.submit` record's), and a 422 names the field it refuses."""

    # Strict: `"5"` or `5.0` for an integer is refused, as in a Kafka record.
    model_config = ConfigDict(extra="forbid", strict=True)

    exec: str = Field(
        description="Job type, dotted tokens: `image.resize`",
        json_schema_extra={"minLength": 1, "maxLength": MAX_EXEC_LENGTH, "pattern": _EXEC_PATTERN},
    )
    payload: Any = Field(
        None,
        description=(
            f"Opaque JSON, handed to the worker as is: nested at most {MAX_JSON_DEPTH} levels, "
            "integers within signed 64 bits, no NaN or Infinity"
        ),
    )
    id: str | None = Field(
        None,
        description=f"Job id; a new random one when absent. {ID_RULE}",
        json_schema_extra={"minLength": 1, "maxLength": MAX_ID_LENGTH, "pattern": ID_PATTERN},
    )
    client_id: str | None = Field(
        None,
        description="Admins only: submit for this client",
        json_schema_extra={"minLength": 1, "maxLength": MAX_ID_LENGTH},
    )
    max_attempts: int | None = Field(
        None, json_schema_extra={"minimum": 1, "maximum": MAX_ATTEMPTS_LIMIT}
    )
    timeout_s: float | None = Field(
        None, json_schema_extra={"exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_S}
    )
    priority: int = Field(0, json_schema_extra={"minimum": PRIORITY_MIN, "maximum": PRIORITY_MAX})
    delay_s: float = Field(0.0, json_schema_extra={"minimum": 0, "maximum": MAX_DELAY_S})
    retry: RetrySubmission | None = Field(
        None, description="Delays between attempts (defaults: the exec's, from the settings)"
    )
    expires_at: float | None = Field(
        None,
        description="Unix time: a job not started by then ends `expired` and never runs",
        json_schema_extra={"minimum": 0},
    )
    ttl_s: float | None = Field(
        None,
        description="As `expires_at`, in seconds after the job is accepted (give one of the two)",
        json_schema_extra={"exclusiveMinimum": 0, "maximum": MAX_DELAY_S},
    )
    max_run_s: float | None = Field(
        None,
        description="Hard time limit of each attempt: heartbeats cannot carry one past it, "
        "and reaching it fails the attempt (`time_limit`) and stops its worker (default: the "
        "exec's, from the settings)",
        json_schema_extra={"exclusiveMinimum": 0, "maximum": MAX_DELAY_S},
    )
    key: str | None = Field(
        None,
        description="A concurrency key (`account:42`): the key limits in force bound how many "
        "jobs of one key run at once and how fast they start (`/v1/limits/key/...`)",
        json_schema_extra={"minLength": 1, "maxLength": MAX_KEY_LENGTH},
    )


class JobBatch(_Body):
    jobs: list[JobSubmission] = Field(min_length=1, max_length=10_000)


class HeldAttempt(_Body):
    id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    attempt: int = Field(ge=1)
    lease: str = Field(min_length=1, max_length=MAX_ID_LENGTH)


class Poll(_Body):
    subjects: list[str] = Field(
        min_length=1, description="NATS-style patterns: `job.assign.image.*`"
    )
    credits: int = Field(ge=0, le=10_000, description="How many jobs the worker can take now")
    wait_s: float = Field(20.0, ge=0, le=60, description="Long-poll for up to this long")
    held: list[HeldAttempt] | None = Field(
        None,
        max_length=10_000,
        description="The attempts the worker holds (running, or settling): with `epoch`, lets "
        "a new leader requeue at once what the worker never received",
    )
    epoch: int | None = Field(
        None,
        ge=0,
        description="The leader epoch of this worker's previous poll answer (none at its "
        "start): when it is not the leader's, the poll rejoins the worker with `held`",
    )


class Settle(_Body):
    attempt: int = Field(ge=1)
    lease: str = Field(min_length=1)
    worker_id: str | None = None


class Ack(Settle):
    result: Any = None


class ProgressReport(_Body):
    done: float = Field(ge=0, le=MAX_PROGRESS_NUMBER, description="Work done so far")
    total: float | None = Field(None, ge=0, le=MAX_PROGRESS_NUMBER, description="All of it")
    message: str | None = Field(None, max_length=MAX_PROGRESS_MESSAGE)


class Beat(Settle):
    progress: ProgressReport | None = Field(
        None,
        description="The handler's progress; the job keeps at most one report a second "
        "(one sooner is dropped, the heartbeat still counts)",
    )


class Fail(Settle):
    error: str = ""
    retryable: bool = True
    retry_after_s: float | None = Field(
        None,
        description="Retry no sooner than this many seconds from now, instead of after the "
        "job's retry policy's delay",
        json_schema_extra={"minimum": 0, "maximum": MAX_RETRY_DELAY_S},
    )


class BatchAck(Ack):
    id: str


class AckBatch(_Body):
    acks: list[BatchAck] = Field(min_length=1, max_length=10_000)


class Settled(BaseModel):
    id: str
    status: str | None = None
    error: str | None = None
    detail: str | None = None


class SettledBatch(BaseModel):
    results: list[Settled]


class HeartbeatAnswer(BaseModel):
    id: str
    deadline: float
    cancel: str | None = Field(
        None,
        description="`cancel_requested` when the job was cancelled: stop the handler and "
        "fail the attempt to confirm",
    )


class CancelBody(_Body):
    reason: str = Field("", max_length=1_000, description="Why (recorded in the job's error)")


class BulkCancel(_Body):
    """Which jobs an admin's bulk cancel ends (at least one of exec and client_id)."""

    exec: str | None = Field(
        None, description="An exec pattern: `image.*` (one token), `image.>` (one or more)"
    )
    client_id: str | None = Field(None, min_length=1, max_length=MAX_ID_LENGTH)
    status: Literal["queued", "running", "any"] = Field(
        "queued", description="queued (a purge), running, or any of the two"
    )
    limit: int = Field(1_000, ge=1, le=10_000, description="Most jobs this call cancels")
    reason: str = Field("", max_length=1_000)


class BulkCancelled(BaseModel):
    cancelled: int = Field(description="Queued jobs now cancelled")
    cancelling: int = Field(description="Running jobs whose workers were told to stop")


class QueueView(BaseModel):
    exec: str
    ready: int
    delayed: int
    running: int
    paused: bool = Field(False, description="An exec pause holds it: nothing new starts")


class PauseView(BaseModel):
    scope: Literal["exec", "client"]
    target: str = Field(description="The exec pattern, or the client id")
    at: float
    by: str | None = Field(description="The name of the key that paused it")
    reason: str


class PauseList(BaseModel):
    pauses: list[PauseView]


class PauseBody(_Body):
    reason: str = Field("", max_length=1_000, description="Why (kept with the pause)")


LimitScope = Literal["client", "exec", "key"]


class LimitView(BaseModel):
    """A limit in force: a runtime one (set through the API, an event in the log) or one of
    the settings' (`[dispatcher.limits.<scope>."<target>"]`)."""

    scope: LimitScope
    target: str = Field(
        description="A client id; an exec pattern (`image.>`: one budget shared by every "
        "exec it matches); a concurrency key, or a key pattern ending in `*` (`account:*`: "
        "a budget for each key with that prefix)"
    )
    max_inflight: int | None = Field(description="Jobs running at once (null: no bound)")
    rate: float | None = Field(description="Starts per second (null: no bound)")
    burst: int | None = Field(description="Starts the rate's token bucket holds")
    source: Literal["runtime", "settings"] = Field(
        description="runtime: set through the API (replaces the settings' limit of the same "
        "scope and target until removed)"
    )
    by: str | None = Field(None, description="The name of the key that set it (runtime)")
    reason: str = ""
    at: float | None = Field(None, description="When it was set (runtime)")
    inflight: int | None = Field(
        None,
        description="Jobs it counts running now (client, exec, an exact key; null for a key "
        "pattern, whose budgets are per key)",
    )
    held: int = Field(0, description="Queued jobs it holds back now")


class LimitList(BaseModel):
    limits: list[LimitView]


class LimitBody(_Body):
    """A runtime limit: `max_inflight`, `rate` (with `burst`), or both."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_inflight: int | None = Field(
        None, ge=1, le=MAX_INFLIGHT, description="Jobs running at once"
    )
    rate: float | None = Field(
        None, gt=0, le=MAX_RATE, allow_inf_nan=False, description="Starts per second"
    )
    burst: int | None = Field(
        None,
        ge=1,
        le=MAX_BURST,
        description="Starts at once after a quiet spell (with `rate`; default: the rate, "
        "rounded up)",
    )
    reason: str = Field("", max_length=MAX_LIMIT_REASON, description="Why (kept with the limit)")

    @model_validator(mode="after")
    def _knobs(self) -> LimitBody:
        if self.max_inflight is None and self.rate is None:
            raise ValueError("give max_inflight, rate, or both")
        if self.burst is not None and self.rate is None:
            raise ValueError("burst: only with a rate")
        return self


class LimitRemovedAnswer(BaseModel):
    removed: bool = Field(description="False: no runtime limit of that scope and target")
    limit: LimitView | None = Field(
        description="The limit that applies now (the settings' one, if any)"
    )


class QueueList(BaseModel):
    queues: list[QueueView]


class WorkerView(BaseModel):
    worker_id: str
    subjects: list[str]
    credit: int
    last_seen: float
    running: list[str]


class WorkerList(BaseModel):
    workers: list[WorkerView]


class LeaderView(BaseModel):
    leader: str | None
    node: str
    is_leader: bool
    epoch: int | None


class ErrorBody(BaseModel):
    """Every error the API answers (`dispatch.api.errors`)."""

    error: str = Field(description="A stable code: `invalid`, `not_found`, `conflict`, ...")
    detail: str = Field(description="What went wrong, naming the field or the id")


class ValidationErrorBody(ErrorBody):
    """A 422: `detail` names each refused field (`body.payload: NaN is not JSON`)."""

    fields: list[str] = Field(
        default_factory=list,
        description="One `location: problem` per refused field, when the request's shape was "
        "refused (absent when the refusal is about a value as a whole)",
    )


class NotLeaderBody(ErrorBody):
    """A 307 from a follower: the same request goes to `leader` (also in `Location`)."""

    leader: str


def error_responses(descriptions: Mapping[int, str]) -> dict[int | str, dict[str, Any]]:
    """`responses=` of a route: each status with its error body and what it means there."""
    return {
        status: {
            "model": ValidationErrorBody if status == 422 else ErrorBody,
            "description": text,
        }
        for status, text in descriptions.items()
    }

"""Request and response bodies of the REST contract (they make the OpenAPI document)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    # An unknown field is a client bug (a typo such as `max_attempt`): refuse it, naming it.
    model_config = ConfigDict(extra="forbid")


class JobSubmission(_Body):
    exec: str = Field(description="Job type, dotted tokens: `image.resize`")
    payload: Any = Field(None, description="Opaque JSON, handed to the worker as is")
    id: str | None = Field(None, description="Job id; a new random one when absent")
    client_id: str | None = Field(None, description="Admins only: submit for this client")
    max_attempts: int | None = Field(None, ge=1)
    timeout_s: float | None = Field(None, gt=0)
    priority: int = 0
    delay_s: float = Field(0.0, ge=0)


class JobBatch(_Body):
    jobs: list[JobSubmission] = Field(min_length=1, max_length=10_000)


class Accepted(BaseModel):
    id: str
    status: str
    existing: bool = Field(False, description="True if this id was already known")


class AcceptedBatch(BaseModel):
    jobs: list[Accepted]


class JobView(BaseModel):
    id: str
    client_id: str
    exec: str
    payload: Any
    status: str
    attempts: int
    max_attempts: int
    timeout_s: float
    priority: int
    not_before: float | None
    worker_id: str | None
    deadline: float | None
    submitted_at: float
    updated_at: float
    result: Any
    error: str | None
    dead_reason: str | None


class Poll(_Body):
    subjects: list[str] = Field(
        min_length=1, description="NATS-style patterns: `job.assign.image.*`"
    )
    credits: int = Field(ge=0, le=10_000, description="How many jobs the worker can take now")
    wait_s: float = Field(20.0, ge=0, le=60, description="Long-poll for up to this long")


class Assignment(BaseModel):
    id: str
    exec: str
    payload: Any
    attempt: int
    deadline: float
    lease: str


class Assignments(BaseModel):
    assignments: list[Assignment]


class Settle(_Body):
    attempt: int = Field(ge=1)
    lease: str = Field(min_length=1)
    worker_id: str | None = None


class Ack(Settle):
    result: Any = None


class Fail(Settle):
    error: str = ""
    retryable: bool = True


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


class JobList(BaseModel):
    jobs: list[JobView]


class QueueView(BaseModel):
    exec: str
    ready: int
    delayed: int
    running: int


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
    error: str
    detail: str

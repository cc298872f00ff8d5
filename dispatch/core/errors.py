"""Typed failures of the core.

`Rejected` answers a command that is not valid in the current state (the API maps its code to
403/404/409/422); nothing was applied. `InvalidTransition` means an *event* does not fit the state
it is applied to: the log and the state disagree, which is a bug or a corrupt log, never a user
error.
"""

from __future__ import annotations

from enum import StrEnum


class RejectCode(StrEnum):
    """Why a command was refused. The value is the API's `error` code."""

    NOT_FOUND = "not_found"
    """No job with this id."""
    STALE_LEASE = "stale_lease"
    """The attempt/lease (or worker, or the worker's owner) is not the job's current
    assignment."""
    ALREADY_SETTLED = "already_settled"
    """The attempt/lease is the job's last one, but it ended with a different outcome."""
    NOT_CANCELLABLE = "not_cancellable"
    """Only queued jobs (ready or delayed) can be cancelled."""
    NOT_DEAD = "not_dead"
    """Only dead-lettered jobs can be redriven."""
    UNKNOWN_WORKER = "unknown_worker"
    """The worker has not joined (or was lost): it must join again."""
    STALE_EPOCH = "stale_epoch"
    """A leader epoch not newer than the current one."""
    INVALID = "invalid"
    """A malformed argument (bad pattern, non-positive credit, ...)."""
    FORBIDDEN = "forbidden"
    """The worker id is live and registered by another API key."""

    @property
    def http_status(self) -> int:
        """The HTTP status the API answers with."""
        return _HTTP_STATUS[self]


_HTTP_STATUS: dict[RejectCode, int] = {
    RejectCode.NOT_FOUND: 404,
    RejectCode.STALE_LEASE: 409,
    RejectCode.ALREADY_SETTLED: 409,
    RejectCode.NOT_CANCELLABLE: 409,
    RejectCode.NOT_DEAD: 409,
    RejectCode.UNKNOWN_WORKER: 404,
    RejectCode.STALE_EPOCH: 409,
    RejectCode.INVALID: 422,
    RejectCode.FORBIDDEN: 403,
}


class Rejected(Exception):
    """A command the current state refuses. Nothing was applied, no event was emitted."""

    def __init__(self, code: RejectCode, detail: str, *, job_id: str | None = None) -> None:
        super().__init__(f"{code.value}: {detail}")
        self.code = code
        self.detail = detail
        self.job_id = job_id

    @property
    def http_status(self) -> int:
        return self.code.http_status


class InvalidTransition(ValueError):
    """An event that cannot apply to the job's (or worker's) current state."""

"""What a handler receives (`Assignment`), how it signals failure (`Retry`,
`PermanentError`), and how an attempt's end becomes an ack or a failure (`Outcome`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dispatch import wire


class Retry(Exception):
    """Fail this attempt as retryable: the job runs again (attempt + 1) if attempts remain,
    else it goes to the dead-letter queue. Any other exception does the same.

    The next attempt waits the job's retry delay (its retry policy), or `delay_s` seconds
    when given (`raise Retry("rate limited", delay_s=30)`: the handler knows best, e.g. from
    a Retry-After header)."""

    def __init__(self, *args: object, delay_s: float | None = None) -> None:
        super().__init__(*args)
        if delay_s is not None and not (isinstance(delay_s, int | float) and delay_s >= 0):
            raise ValueError(f"Retry(delay_s=...): expected a number >= 0, got {delay_s!r}")
        self.delay_s = None if delay_s is None else float(delay_s)


class PermanentError(Exception):
    """Fail the job for good: it goes to the dead-letter queue at once, however many
    attempts remain."""


class Assignment(wire.Assignment):
    """One attempt at a job, as a handler receives it: the wire assignment (`id, exec,
    payload, attempt, deadline, lease`) and the id of the worker running it. `deadline` is
    the leader's clock (epoch seconds); heartbeats move it while the handler runs."""

    worker_id: str

    @classmethod
    def from_message(cls, message: Mapping[str, Any], worker_id: str) -> Assignment:
        """Read an assignment as the leader sends it (REST poll, WebSocket `assign`);
        a `ValueError` (pydantic's `ValidationError`) names what is missing or malformed."""
        return cls.model_validate({**message, "worker_id": worker_id})


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: what is sent to the leader."""

    kind: Literal["ack", "fail"]
    result: Any = None
    error: str = ""
    retryable: bool = True
    retry_after_s: float | None = None
    """The worker's own delay before the next attempt (None: the job's retry policy)."""


def outcome_of_error(error: BaseException) -> Outcome:
    """`PermanentError` → a permanent failure; `Retry` and anything else → retryable."""
    if isinstance(error, PermanentError):
        return Outcome("fail", error=str(error) or "PermanentError", retryable=False)
    if isinstance(error, Retry):
        return Outcome(
            "fail", error=str(error) or "Retry", retryable=True, retry_after_s=error.delay_s
        )
    return Outcome("fail", error=f"{type(error).__name__}: {error}".rstrip(": "), retryable=True)


def outcome_of_result(result: Any) -> Outcome:
    """An ack with `result`, or a permanent failure when it cannot travel as JSON (running
    the same handler again would return the same)."""
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as error:
        return Outcome("fail", error=f"the result is not JSON: {error}", retryable=False)
    return Outcome("ack", result=result)


def released(worker_id: str) -> Outcome:
    # Nothing failed: the worker stopped. The job may run again at once, elsewhere.
    return Outcome(
        "fail", error=f"worker {worker_id} stopped before the job finished", retry_after_s=0.0
    )

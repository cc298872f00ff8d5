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
    else it goes to the dead-letter queue. Any other exception does the same."""


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


def outcome_of_error(error: BaseException) -> Outcome:
    """`PermanentError` → a permanent failure; `Retry` and anything else → retryable."""
    if isinstance(error, PermanentError):
        return Outcome("fail", error=str(error) or "PermanentError", retryable=False)
    if isinstance(error, Retry):
        return Outcome("fail", error=str(error) or "Retry", retryable=True)
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
    return Outcome("fail", error=f"worker {worker_id} stopped before the job finished")

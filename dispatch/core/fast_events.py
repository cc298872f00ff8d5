"""Fast construction of the three events of every job's life (the scheduler's hot path).

A frozen dataclass's __init__ sets every field through object.__setattr__ and parses keyword
arguments, which made `enqueued`, `assigned` and `completed` cost a third of a submit-assign-
ack cycle. Writing the slots through their descriptors builds the very same (equal, frozen)
object in about half the time (BENCHMARKS.md, *Dispatcher core*).
tests/unit/core/test_fast_events.py checks each factory against the constructor, and the
import-time check below catches a field added without updating them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dispatch.core.events import _FIELDS, Assigned, Completed, Enqueued, Event
from dispatch.core.retry import RetryPolicy

_new = object.__new__


def _slot_setters(
    cls: type[Event], names: tuple[str, ...]
) -> tuple[Callable[[Any, Any], None], ...]:
    if names != _FIELDS[cls]:
        raise AssertionError(f"fast factory of {cls.__name__} is out of date: {_FIELDS[cls]}")
    return tuple(getattr(cls, name).__set__ for name in names)


_ENQUEUED_SETTERS = _slot_setters(
    Enqueued,
    (
        "epoch",
        "at",
        "job_id",
        "client_id",
        "exec",
        "payload",
        "max_attempts",
        "timeout_s",
        "priority",
        "not_before",
        "seq",
        "retry",
        "expires_at",
        "max_run_s",
        "key",
    ),
)
_ASSIGNED_SETTERS = _slot_setters(
    Assigned, ("epoch", "at", "job_id", "worker_id", "attempt", "lease", "deadline")
)
_COMPLETED_SETTERS = _slot_setters(
    Completed, ("epoch", "at", "job_id", "worker_id", "attempt", "lease", "result")
)


def new_enqueued(
    epoch: int,
    at: float,
    job_id: str,
    client_id: str,
    exec_name: str,
    payload: Any,
    max_attempts: int,
    timeout_s: float,
    priority: int,
    not_before: float | None,
    seq: int,
    retry: RetryPolicy | None = None,
    expires_at: float | None = None,
    max_run_s: float | None = None,
    key: str | None = None,
    _setters: tuple[Callable[[Any, Any], None], ...] = _ENQUEUED_SETTERS,
) -> Enqueued:
    """Same as Enqueued(...) with these values, faster (no validation in either)."""
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14 = _setters
    event: Enqueued = _new(Enqueued)
    s0(event, epoch)
    s1(event, at)
    s2(event, job_id)
    s3(event, client_id)
    s4(event, exec_name)
    s5(event, payload)
    s6(event, max_attempts)
    s7(event, timeout_s)
    s8(event, priority)
    s9(event, not_before)
    s10(event, seq)
    s11(event, retry)
    s12(event, expires_at)
    s13(event, max_run_s)
    s14(event, key)
    return event


def new_assigned(
    epoch: int,
    at: float,
    job_id: str,
    worker_id: str,
    attempt: int,
    lease: str,
    deadline: float,
    _setters: tuple[Callable[[Any, Any], None], ...] = _ASSIGNED_SETTERS,
) -> Assigned:
    """Same as Assigned(...) with these values, faster."""
    s0, s1, s2, s3, s4, s5, s6 = _setters
    event: Assigned = _new(Assigned)
    s0(event, epoch)
    s1(event, at)
    s2(event, job_id)
    s3(event, worker_id)
    s4(event, attempt)
    s5(event, lease)
    s6(event, deadline)
    return event


def new_completed(
    epoch: int,
    at: float,
    job_id: str,
    worker_id: str,
    attempt: int,
    lease: str,
    result: Any,
    _setters: tuple[Callable[[Any, Any], None], ...] = _COMPLETED_SETTERS,
) -> Completed:
    """Same as Completed(...) with these values, faster."""
    s0, s1, s2, s3, s4, s5, s6 = _setters
    event: Completed = _new(Completed)
    s0(event, epoch)
    s1(event, at)
    s2(event, job_id)
    s3(event, worker_id)
    s4(event, attempt)
    s5(event, lease)
    s6(event, result)
    return event

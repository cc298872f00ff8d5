"""Small helpers shared by the core's unit tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dispatch.core import (
    Assigned,
    CoreConfig,
    Dispatcher,
    Event,
    Reassigned,
    SubmitRequest,
)
from dispatch.core.leases import seeded_lease_tokens

T0 = 1_000.0
"""The time tests start at (any positive number would do)."""


def make(**config: Any) -> Dispatcher:
    """A dispatcher with defaults suited to tests: no worker expiry unless asked for, and
    lease tokens from a seeded source, so the same commands give the same events."""
    config.setdefault("worker_expiry_s", None)
    return Dispatcher(CoreConfig(**config), lease_token=seeded_lease_tokens(0))


def request(job_id: str, exec_name: str = "image.resize", **fields: Any) -> SubmitRequest:
    fields.setdefault("payload", {"job": job_id})
    return SubmitRequest(id=job_id, exec=exec_name, **fields)


def worker(
    dispatcher: Dispatcher,
    worker_id: str,
    subjects: Iterable[str] = ("job.assign.>",),
    credits: int = 0,
    now: float = T0,
) -> list[Event]:
    """Join a worker and grant it credits; returns the events (assignments included)."""
    events = dispatcher.join(worker_id, list(subjects), now)
    if credits:
        events += dispatcher.grant_credit(worker_id, credits, now)
    return events


def assignments(events: Iterable[Event]) -> list[Assigned | Reassigned]:
    return [event for event in events if isinstance(event, Assigned | Reassigned)]


def assigned_ids(events: Iterable[Event]) -> list[str]:
    return [event.job_id for event in assignments(events)]


def types(events: Iterable[Event]) -> list[str]:
    return [event.type for event in events]


def ack(
    dispatcher: Dispatcher, event: Assigned | Reassigned, now: float, result: Any = None
) -> list[Event]:
    return dispatcher.ack(event.job_id, event.attempt, event.lease, now, result=result)

"""Small helpers shared by the core's unit tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from dispatch.core import (
    Assigned,
    CoreConfig,
    Dispatcher,
    Event,
    JobRecord,
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


def check_replay(dispatcher: Dispatcher, events: Iterable[Event]) -> None:
    """All of `dispatcher`'s events, replayed on an empty dispatcher (through their dicts),
    give the same state, and folding each job's events alone gives the same records."""
    from dispatch.core import (
        JobEvent,
        check_invariants,
        event_from_dict,
        fold_job_events,
        state_view,
    )

    events = [event_from_dict(event.to_dict()) for event in events]
    replica = Dispatcher(dispatcher.config)
    replica.apply_all(events)
    check_invariants(dispatcher)
    check_invariants(replica)
    assert state_view(replica) == state_view(dispatcher)
    for job in dispatcher.jobs():
        own = [e for e in events if isinstance(e, JobEvent) and e.job_id == job.id]
        folded = fold_job_events(None, own)
        assert folded is not None and folded.to_dict() == job.to_dict(), job.id


class Run:
    """A dispatcher and every event it returned, to check a replay of them against it
    (`check`). `defaults` are config values a test module gives all its runs."""

    defaults: ClassVar[Mapping[str, Any]] = {}
    credits = 1
    """The credit worker `w` joins with."""

    def __init__(self, **config: Any) -> None:
        self.core = make(**{**self.defaults, **config})
        self.log: list[Event] = []

    def __call__(self, events: list[Event]) -> list[Event]:
        self.log += events
        return events

    def start(self, job_id: str = "j1", credits: int | None = None, **fields: Any) -> Assigned:
        """Submit `job_id` and start it on worker `w` (joined on the first call)."""
        if self.core.worker("w") is None:
            self(worker(self.core, "w", credits=self.credits if credits is None else credits))
        (assigned,) = assignments(self(self.core.submit(request(job_id, **fields), T0)))
        assert isinstance(assigned, Assigned)
        return assigned

    def job(self, job_id: str = "j1") -> JobRecord:
        job = self.core.job(job_id)
        assert job is not None
        return job

    def check(self) -> None:
        check_replay(self.core, self.log)

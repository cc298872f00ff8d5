"""A recorded window, derived from the events log: the jobs submitted in it, how each of their
attempts behaved, and the fleet of workers that served them.

Pure: takes core events in log order (read from Delta by `dispatch.replay.source`, or made by a
test with the core itself) and returns a `History`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from dispatch.core.events import (
    Assigned,
    Cancelled,
    CancelRequested,
    Completed,
    CreditGranted,
    DeadLettered,
    Enqueued,
    Event,
    JobEvent,
    JobHeartbeat,
    LimitRemoved,
    LimitSet,
    Paused,
    Reassigned,
    Requeued,
    Resumed,
    WorkerJoined,
    WorkerLost,
)
from dispatch.core.job import DeadReason, RequeueReason
from dispatch.core.subjects import assign_subject
from dispatch.replay.model import (
    ANSWERING,
    Attempt,
    History,
    Outcome,
    RecordedControl,
    RecordedJob,
    RecordedLimit,
    RecordedWorker,
)
from dispatch.replay.slot_returns import SlotReturns


@dataclass(slots=True)
class _JobTrail:
    enqueued: Enqueued
    attempts: list[Attempt] = field(default_factory=list)
    started_at: float | None = None
    """When the attempt running now started (None: none runs)."""
    heartbeats: list[float] = field(default_factory=list)
    """The running attempt's job heartbeats, in seconds after its start."""
    cancelled_at: float | None = None
    cancel_by: str | None = None
    cancel_reason: str = ""
    cancel_deadline: float | None = None
    """The running attempt's deadline once a cancel of it was asked for (heartbeats no longer
    move it): reaching it is its grace passing."""
    cancel_stop_s: float | None = None

    def end_attempt(
        self, at: float, outcome: Outcome, order: int, retry_after_s: float | None = None
    ) -> float | None:
        """Ends the running attempt; returns when it had started (None: none ran)."""
        started_at = self.started_at
        if started_at is not None:
            beats = tuple(self.heartbeats)
            self.attempts.append(
                Attempt(
                    max(0.0, at - started_at),
                    outcome,
                    order,
                    heartbeats=beats,
                    retry_after_s=retry_after_s,
                )
            )
            self.started_at = None
            self.heartbeats.clear()
        self.cancel_deadline = None
        return started_at


@dataclass(slots=True)
class _WorkerTrail:
    worker_id: str
    subjects: tuple[str, ...] = ()
    execs: set[str] = field(default_factory=set)
    running: int = 0
    credit: int = 0
    slots: int = 0
    joined_at: float | None = None
    left_at: float | None = None
    seen_before_join: bool = False

    def observe(self) -> None:
        self.slots = max(self.slots, self.running + self.credit)


_DEAD_OUTCOMES = {
    DeadReason.PERMANENT_FAILURE: Outcome.FAILED_PERMANENT,
    DeadReason.RETRIES_EXHAUSTED: Outcome.FAILED,
    DeadReason.TIME_LIMIT: Outcome.TIME_LIMIT,
}
_REQUEUE_OUTCOMES = {
    RequeueReason.FAILED: Outcome.FAILED,
    RequeueReason.TIME_LIMIT: Outcome.TIME_LIMIT,
}
_HOLDING_REQUEUES = frozenset({RequeueReason.TIMEOUT, RequeueReason.TIME_LIMIT})
_HOLDING_DEATHS = frozenset({DeadReason.ACK_TIMEOUT, DeadReason.TIME_LIMIT})
"""Endings of an attempt whose worker still runs it: its slot comes back with its late
answer (refused, not logged) and the credit after it."""


class _Recorder:
    """Folds the log into job trails and worker trails."""

    def __init__(
        self, since: float, until: float, losses: frozenset[tuple[str, float]] = frozenset()
    ) -> None:
        self.losses = losses
        """(worker id, time) of every worker loss in the read."""
        self.since = since
        self.until = until
        self.jobs: dict[str, _JobTrail] = {}
        self.controls: list[RecordedControl | RecordedLimit] = []
        """Pauses and resumes, limits set and removed, in log order."""
        self.workers: dict[str, _WorkerTrail] = {}
        self.events: list[JobEvent] = []
        self.position = 0
        """The index of the event being folded, in the read."""
        self.slot_returns = SlotReturns()

    def worker(self, worker_id: str) -> _WorkerTrail:
        trail = self.workers.get(worker_id)
        if trail is None:
            trail = self.workers[worker_id] = _WorkerTrail(worker_id)
        return trail

    def release(self, worker_id: str) -> None:
        worker = self.worker(worker_id)
        worker.running = max(0, worker.running - 1)

    def take(self, worker_id: str, job: _JobTrail | None, at: float) -> None:
        worker = self.worker(worker_id)
        worker.running += 1
        worker.credit = max(0, worker.credit - 1)
        if worker.joined_at is None:
            worker.seen_before_join = True
        worker.observe()
        if job is not None:
            worker.execs.add(job.enqueued.exec)
            job.started_at = at

    def fold(self, event: Event) -> None:
        if isinstance(event, JobEvent):
            self.fold_job_event(event)
        elif isinstance(event, Paused):
            self.controls.append(
                RecordedControl(
                    event.at, True, event.scope.value, event.target, event.by, event.reason
                )
            )
        elif isinstance(event, Resumed):
            self.controls.append(
                RecordedControl(event.at, False, event.scope.value, event.target, event.by)
            )
        elif isinstance(event, LimitSet):
            self.controls.append(
                RecordedLimit(
                    event.at,
                    True,
                    event.scope.value,
                    event.target,
                    max_inflight=event.max_inflight,
                    rate=event.rate,
                    burst=event.burst,
                    by=event.by,
                    reason=event.reason,
                )
            )
        elif isinstance(event, LimitRemoved):
            self.controls.append(
                RecordedLimit(event.at, False, event.scope.value, event.target, by=event.by)
            )
        elif isinstance(event, WorkerJoined):
            worker = self.worker(event.worker_id)
            worker.subjects = event.subjects
            if worker.joined_at is None and not worker.seen_before_join:
                worker.joined_at = event.at
        elif isinstance(event, CreditGranted):
            worker = self.worker(event.worker_id)
            worker.credit = event.credits if event.replace else worker.credit + event.credits
            self.slot_returns.granted(
                event.worker_id, event.credits, event.replace, event.at, self.position
            )
            if worker.joined_at is None:
                worker.seen_before_join = True
            worker.observe()
        elif isinstance(event, WorkerLost):
            worker = self.worker(event.worker_id)
            worker.left_at = event.at
            worker.running = worker.credit = 0
            self.slot_returns.lost(event.worker_id)

    def end(
        self,
        job: _JobTrail | None,
        at: float,
        outcome: Outcome,
        worker_id: str,
        *,
        timed_out: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        if job is None:
            return
        started_at = job.end_attempt(at, outcome, self.position, retry_after_s)
        if started_at is None:
            return
        attempt = (job.enqueued.job_id, len(job.attempts) - 1)
        if timed_out:
            self.slot_returns.timed_out(worker_id, attempt, started_at)
        elif outcome is not Outcome.STALLED:
            self.slot_returns.settled(worker_id, attempt, started_at, at)

    def fold_job_event(self, event: JobEvent) -> None:
        if isinstance(event, Enqueued):
            if self.since <= event.at < self.until and event.job_id not in self.jobs:
                self.jobs[event.job_id] = _JobTrail(event)
                self.events.append(event)
            return
        job = self.jobs.get(event.job_id)
        if job is not None:
            self.events.append(event)
        if isinstance(event, Assigned):
            self.take(event.worker_id, job, event.at)
        elif isinstance(event, Reassigned):
            # The timed-out attempt never settled; the job moves to the new attempt.
            self.release(event.previous_worker_id)
            self.end(job, event.at, Outcome.STALLED, event.previous_worker_id, timed_out=True)
            self.take(event.worker_id, job, event.at)
        elif isinstance(event, Completed):
            self.release(event.worker_id)
            self.end(job, event.at, Outcome.COMPLETED, event.worker_id)
        elif isinstance(event, Requeued):
            self.release(event.worker_id)
            outcome = _REQUEUE_OUTCOMES.get(event.reason, Outcome.STALLED)
            timed_out = event.reason in _HOLDING_REQUEUES
            self.end(
                job, event.at, outcome, event.worker_id,
                timed_out=timed_out, retry_after_s=event.retry_after_s,
            )  # fmt: skip
        elif isinstance(event, DeadLettered):
            self.release(event.worker_id)
            timed_out = event.reason in _HOLDING_DEATHS
            outcome = _DEAD_OUTCOMES.get(event.reason, Outcome.STALLED)
            self.end(job, event.at, outcome, event.worker_id, timed_out=timed_out)
        elif isinstance(event, JobHeartbeat):
            if job is not None and job.started_at is not None:
                job.heartbeats.append(event.at - job.started_at)
                if job.cancel_deadline is not None:
                    job.cancel_deadline = event.deadline  # a failover moved it
        elif isinstance(event, CancelRequested):
            if job is not None:
                job.cancelled_at, job.cancel_by, job.cancel_reason = (
                    event.at,
                    event.by,
                    event.reason,
                )
                job.cancel_deadline = event.deadline
        elif isinstance(event, Cancelled) and event.worker_id is not None:
            self.cancelled_running(job, event, event.worker_id)
        elif isinstance(event, Cancelled) and job is not None:
            job.cancelled_at, job.cancel_by, job.cancel_reason = event.at, event.by, event.reason

    def cancelled_running(self, job: _JobTrail | None, event: Cancelled, worker_id: str) -> None:
        """A running job ended `cancelled`. Its worker confirmed (a failure of the attempt,
        not logged as such); or its grace passed (the event comes at the attempt's deadline:
        the worker still held it); or its worker was lost (the loss is logged at that same
        instant)."""
        self.release(worker_id)
        if job is None:
            return
        deadline = job.cancel_deadline
        if (worker_id, event.at) in self.losses:
            self.end(job, event.at, Outcome.STALLED, worker_id)
        elif deadline is not None and event.at >= deadline:
            self.end(job, event.at, Outcome.STALLED, worker_id, timed_out=True)
        else:
            if job.cancelled_at is not None:
                job.cancel_stop_s = max(0.0, event.at - job.cancelled_at)
            self.end(job, event.at, Outcome.CANCELLED, worker_id)


def recorded_history(
    events: Iterable[Event],
    *,
    since: float | None = None,
    until: float | None = None,
    warmup_s: float = 0.0,
) -> History:
    """The window [since, until) of `events` (in log order): every job enqueued in the read
    from `since - warmup_s` on, with its recorded attempts, and every worker seen; the jobs
    enqueued in [since, until) are the ones reported (`History.reported`). The others are
    replayed but not counted: those before `since` make the backlog and the busy workers the
    window starts with (a simulation's warm-up), those after `until` (the read's tail, which
    shows the window's jobs finish) still compete with the window's last jobs, as they did.
    `since`/`until` None: from the first / to after the last event."""
    ordered: Sequence[Event] = events if isinstance(events, Sequence) else list(events)
    start = since if since is not None else (ordered[0].at if ordered else 0.0)
    end = until if until is not None else math.inf
    losses = frozenset(
        (event.worker_id, event.at) for event in ordered if isinstance(event, WorkerLost)
    )
    recorder = _Recorder(start - warmup_s, math.inf, losses)
    for position, event in enumerate(ordered):
        recorder.position = position
        recorder.fold(event)
    jobs = tuple(_recorded_job(trail, recorder.slot_returns) for trail in recorder.jobs.values())
    workers = tuple(
        _recorded_worker(trail)
        for trail in sorted(recorder.workers.values(), key=lambda trail: trail.worker_id)
    )
    last = ordered[-1].at if ordered else start
    return History(
        since=start,
        until=end if math.isfinite(end) else last,
        jobs=jobs,
        workers=workers,
        events=tuple(
            event
            for event in recorder.events
            if start <= recorder.jobs[event.job_id].enqueued.at < end
        ),
        reported=frozenset(
            job_id for job_id, trail in recorder.jobs.items() if start <= trail.enqueued.at < end
        ),
        instants=tuple(sorted({event.at for event in ordered})),
        controls=tuple(recorder.controls),
    )


def _held_slots(
    job_id: str, attempts: Sequence[Attempt], returns: SlotReturns
) -> tuple[Attempt, ...]:
    """The attempts with the time each held its worker's slot: measured from the worker's
    credit where it can be (`SlotReturns`); else, for a stalled attempt, at least as long as
    the job's next settled attempt ran (a job that timed out for being slow most likely ran
    that long again, and its worker's slot stayed taken meanwhile)."""
    out = list(attempts)
    for index, attempt in enumerate(out):
        measured = returns.holds.get((job_id, index))
        if measured is not None:
            slot_s, slot_order = measured
            out[index] = replace(attempt, slot_s=slot_s, slot_order=slot_order)
            continue
        if attempt.outcome is not Outcome.STALLED:
            continue
        settled = next((later for later in out[index + 1 :] if later.outcome in ANSWERING), None)
        if settled is not None and settled.run_s > attempt.run_s:
            out[index] = replace(attempt, slot_s=settled.run_s)
    return tuple(out)


def _recorded_job(trail: _JobTrail, holds: SlotReturns) -> RecordedJob:
    enqueued = trail.enqueued
    return RecordedJob(
        job_id=enqueued.job_id,
        client_id=enqueued.client_id,
        exec=enqueued.exec,
        submitted_at=enqueued.at,
        priority=enqueued.priority,
        max_attempts=enqueued.max_attempts,
        timeout_s=enqueued.timeout_s,
        not_before=enqueued.not_before,
        attempts=_held_slots(enqueued.job_id, trail.attempts, holds),
        cancelled_at=trail.cancelled_at,
        retry=enqueued.retry,
        expires_at=enqueued.expires_at,
        max_run_s=enqueued.max_run_s,
        cancel_by=trail.cancel_by,
        cancel_reason=trail.cancel_reason,
        cancel_stop_s=trail.cancel_stop_s,
        key=enqueued.key,
    )


def _recorded_worker(trail: _WorkerTrail) -> RecordedWorker:
    # A worker that joined before the window (or whose join was not read) shows only the
    # execs it ran: it is given exactly their subjects.
    subjects = trail.subjects or tuple(sorted(assign_subject(name) for name in trail.execs))
    return RecordedWorker(
        worker_id=trail.worker_id,
        subjects=subjects or (assign_subject(">"),),
        slots=max(1, trail.slots),
        joined_at=trail.joined_at,
        left_at=trail.left_at,
    )

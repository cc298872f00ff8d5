"""What requests ask of the leader's loop, by name: every command a route (REST or WebSocket)
hands to the loop, and every read of its committed state.

A `LoopCommand[T]` has two halves, run on the loop thread (`dispatch.api.leader`): `decide(core,
now)` calls the core's commands and returns the events they applied (or raises `Rejected`, changing
nothing); `answer(core, events)` runs only after those events are committed, on committed
state, and its value (a `T`) is what the request awaits (`Node.call`). A read is a command
that decides nothing. The routes parse and check their input, build one of these, and turn
its answer into their response; nothing else of theirs runs on the loop thread.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dispatch.api.hub import Hub, public_job, stop_orders_for
from dispatch.api.worker_sync import Held, rejoin
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import Cancelled, Event, LimitRemoved, Paused
from dispatch.core.job import JobRecord, JobStatus
from dispatch.core.queries import ClientLoads

T = TypeVar("T")

JobView = dict[str, Any]
"""A job as clients see it (`dispatch.wire.JobView`'s fields)."""

AckItem = tuple[str, int, str, Any]
"""(job id, attempt, lease, result) of one ack of many."""


class LoopCommand(Generic[T]):
    """A request's work on the leader loop; see the module's docstring."""

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        """Call the core's commands (a read calls none)."""
        return []

    def answer(self, core: Dispatcher, events: list[Event]) -> T:
        """The request's answer, from the committed state."""
        raise NotImplementedError


def view_of(core: Dispatcher, job_id: str) -> JobView | None:
    """The job's view as every answer of the server shows it (`dispatch.api.hub.public_job`)."""
    job = core.job_view(job_id)
    return None if job is None else public_job(job)


# --- reads ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadJobs(LoopCommand[dict[str, JobView]]):
    """The views of the jobs among `ids` the leader holds."""

    ids: Sequence[str]

    def answer(self, core: Dispatcher, events: list[Event]) -> dict[str, JobView]:
        found: dict[str, JobView] = {}
        for job_id in self.ids:
            view = view_of(core, job_id)
            if view is not None:
                found[job_id] = view
        return found


@dataclass(frozen=True, slots=True)
class ListDeadLetters(LoopCommand[list[JobView]]):
    """Dead-lettered jobs, oldest first, of one exec or all."""

    exec: str | None
    limit: int

    def answer(self, core: Dispatcher, events: list[Event]) -> list[JobView]:
        jobs = [job for job in core.dead_letters() if self.exec is None or job.exec == self.exec]
        return [public_job(job) for job in jobs[: self.limit]]


@dataclass(frozen=True, slots=True)
class ListQueues(LoopCommand[list[dict[str, Any]]]):
    def answer(self, core: Dispatcher, events: list[Event]) -> list[dict[str, Any]]:
        return [
            {**stats.to_dict(), "paused": core.exec_paused(stats.exec)}
            for stats in core.queue_stats()
        ]


def pause_view(paused: Paused) -> dict[str, Any]:
    """A pause in force as the API shows it (`GET /v1/pauses`)."""
    return {
        "scope": paused.scope.value,
        "target": paused.target,
        "at": paused.at,
        "by": paused.by,
        "reason": paused.reason,
    }


@dataclass(frozen=True, slots=True)
class ListPauses(LoopCommand[list[dict[str, Any]]]):
    def answer(self, core: Dispatcher, events: list[Event]) -> list[dict[str, Any]]:
        return [pause_view(paused) for paused in core.pauses()]


@dataclass(frozen=True, slots=True)
class SetPause(LoopCommand[list[dict[str, Any]]]):
    """Pause (`paused=True`) or resume an exec pattern or a client; answers the pauses in
    force after it."""

    scope: str
    target: str
    paused: bool
    by: str | None = None
    reason: str = ""

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        if self.paused:
            return core.pause(self.scope, self.target, now, by=self.by, reason=self.reason)
        return core.unpause(self.scope, self.target, now, by=self.by)

    def answer(self, core: Dispatcher, events: list[Event]) -> list[dict[str, Any]]:
        return [pause_view(paused) for paused in core.pauses()]


@dataclass(frozen=True, slots=True)
class ListLimits(LoopCommand[list[dict[str, Any]]]):
    """Every limit in force (runtime and settings), with what each counts and holds now."""

    def answer(self, core: Dispatcher, events: list[Event]) -> list[dict[str, Any]]:
        return core.limit_views()


@dataclass(frozen=True, slots=True)
class ReadLimit(LoopCommand[dict[str, Any] | None]):
    """The limit in force for exactly (scope, target), or None."""

    scope: str
    target: str

    def answer(self, core: Dispatcher, events: list[Event]) -> dict[str, Any] | None:
        return core.limit_view(self.scope, self.target)


@dataclass(frozen=True, slots=True)
class SetLimit(LoopCommand[dict[str, Any] | None]):
    """Set a runtime limit (replacing the settings' one of the same scope and target);
    answers the limit in force after it."""

    scope: str
    target: str
    max_inflight: int | None = None
    rate: float | None = None
    burst: int | None = None
    by: str | None = None
    reason: str = ""

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.set_limit(
            self.scope, self.target, now, max_inflight=self.max_inflight, rate=self.rate,
            burst=self.burst, by=self.by, reason=self.reason,
        )  # fmt: skip

    def answer(self, core: Dispatcher, events: list[Event]) -> dict[str, Any] | None:
        return core.limit_view(self.scope, self.target)


@dataclass(frozen=True, slots=True)
class RemoveLimit(LoopCommand[tuple[bool, dict[str, Any] | None]]):
    """Remove a runtime limit; answers whether there was one, and the limit that applies
    after it (the settings' one of the same scope and target, if any)."""

    scope: str
    target: str
    by: str | None = None

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.remove_limit(self.scope, self.target, now, by=self.by)

    def answer(self, core: Dispatcher, events: list[Event]) -> tuple[bool, dict[str, Any] | None]:
        removed = any(type(event) is LimitRemoved for event in events)
        return removed, core.limit_view(self.scope, self.target)


@dataclass(frozen=True, slots=True)
class ListWorkers(LoopCommand[list[dict[str, Any]]]):
    def answer(self, core: Dispatcher, events: list[Event]) -> list[dict[str, Any]]:
        return [worker.to_dict() for worker in core.workers()]


@dataclass(frozen=True, slots=True)
class ReadOverview(LoopCommand[dict[str, Any]]):
    """The dashboard's view of the committed state (`GET /v1/overview`), with the leader's
    clock."""

    limit: int

    def answer(self, core: Dispatcher, events: list[Event]) -> dict[str, Any]:
        return {**overview_of(core, self.limit), "server_time": time.time()}


@dataclass(frozen=True, slots=True)
class ReadClientLoads(LoopCommand[tuple[ClientLoads, float]]):
    """Each client's queued and running jobs per exec now, and the leader's clock."""

    def answer(self, core: Dispatcher, events: list[Event]) -> tuple[ClientLoads, float]:
        return core.client_loads(), time.time()


def job_summary(job: JobRecord) -> dict[str, Any]:
    return {
        "id": job.id,
        "client_id": job.client_id,
        "exec": job.exec,
        "status": job.status.value,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "worker_id": job.worker_id,
        "deadline": job.deadline,
        "submitted_at": job.submitted_at,
        "updated_at": job.updated_at,
        "error": job.error,
        "dead_reason": None if job.dead_reason is None else job.dead_reason.value,
    }


def overview_of(core: Dispatcher, limit: int) -> dict[str, Any]:
    """The committed state's part of the dashboard's overview. Runs on the leader loop thread, so it
    costs O(running jobs + workers + limit), never O(jobs held)."""
    running = [
        job
        for worker in core.workers()
        for job_id in worker.running
        if (job := core.job_view(job_id)) is not None and job.status is JobStatus.RUNNING
    ]
    nearest = heapq.nsmallest(limit, running, key=lambda job: job.deadline or 0.0)
    # A running job with an error is on a retry; queued retries are not indexed (the
    # requeued rate in the history counts them).
    retrying = [job for job in running if job.error is not None]
    failures = sorted(
        [*core.latest_dead_letters(limit), *retrying],
        key=lambda job: job.updated_at,
        reverse=True,
    )[:limit]
    return {
        "epoch": core.epoch,
        "counts": core.counts(),
        "in_flight": {"total": len(running), "jobs": [job_summary(job) for job in nearest]},
        "recent_failures": [job_summary(job) for job in failures],
        "recently_finished": [job_summary(job) for job in core.latest_finished(limit)],
    }


# --- clients and admins ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CancelJob(LoopCommand[JobView]):
    """Cancel one job: a queued one ends at once, a running one's worker is told to stop."""

    job_id: str
    by: str | None = None
    reason: str = ""

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.cancel(self.job_id, now, by=self.by, reason=self.reason)

    def answer(self, core: Dispatcher, events: list[Event]) -> JobView:
        return public_job(core.job_view(self.job_id))


@dataclass(frozen=True, slots=True)
class CancelJobs(LoopCommand[dict[str, int]]):
    """Cancel up to `limit` jobs matching a filter (an admin's bulk cancel, or a purge)."""

    exec_pattern: str | None
    client_id: str | None
    statuses: frozenset[JobStatus]
    limit: int
    by: str | None = None
    reason: str = ""

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.cancel_where(
            now, exec_pattern=self.exec_pattern, client_id=self.client_id,
            statuses=self.statuses, limit=self.limit, by=self.by, reason=self.reason,
        )  # fmt: skip

    def answer(self, core: Dispatcher, events: list[Event]) -> dict[str, int]:
        cancelled = sum(1 for event in events if isinstance(event, Cancelled))
        return {"cancelled": cancelled, "cancelling": len(events) - cancelled}


@dataclass(frozen=True, slots=True)
class RedriveJob(LoopCommand[JobView]):
    job_id: str
    by: str | None = None

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.redrive(self.job_id, now, by=self.by)

    def answer(self, core: Dispatcher, events: list[Event]) -> JobView:
        return public_job(core.job_view(self.job_id))


# --- workers -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PresentWorker(LoopCommand[list[dict[str, Any]]]):
    """A REST poll: (re)join if needed, say "I have room for `credits`", count as alive;
    answers which of the attempts it holds (`held`) it must stop (wire `StopAttempt`s).

    Assignments already committed to this worker but not yet taken fill part of that room,
    so the grant is what is left of it. Another key's worker is refused before anything
    changes."""

    hub: Hub
    worker_id: str
    subjects: list[str]
    credits: int
    owner: str | None = None
    held: Sequence[Held] = ()

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        worker_id, owner = self.worker_id, self.owner
        registered = core.worker_owner(worker_id)
        if owner is not None and registered is not None and registered != owner:
            raise Rejected(RejectCode.FORBIDDEN, f"worker id {worker_id!r} belongs to another key")
        events: list[Event] = []
        known = core.worker(worker_id)
        if known is None or list(known.subjects) != self.subjects:
            events += core.join(worker_id, self.subjects, now, owner=owner)
        room = max(0, self.credits - self.hub.undelivered(worker_id))
        events += core.grant_credit(worker_id, room, now, replace=True)
        events += core.worker_heartbeat(worker_id, now)
        return events

    def answer(self, core: Dispatcher, events: list[Event]) -> list[dict[str, Any]]:
        return stop_orders_for(core, self.held)


@dataclass(frozen=True, slots=True)
class RejoinWorker(LoopCommand[tuple[int, list[dict[str, Any]]]]):
    """A worker's hello or first poll of a term (`dispatch.api.worker_sync.rejoin`: what the
    leader believes of the worker becomes what it says); answers the leader's epoch, once the
    session's outbox was restarted, and which of the attempts it holds it must stop."""

    hub: Hub
    worker_id: str
    subjects: list[str]
    held: Collection[Held]
    credits: int
    owner: str | None = None

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return rejoin(
            core, self.worker_id, self.subjects, now,
            held=self.held, credits=self.credits, owner=self.owner,
        )  # fmt: skip

    def answer(self, core: Dispatcher, events: list[Event]) -> tuple[int, list[dict[str, Any]]]:
        self.hub.restart_outbox(self.worker_id)
        return core.epoch, stop_orders_for(core, list(self.held))


@dataclass(frozen=True, slots=True)
class GrantCredit(LoopCommand[None]):
    """A socket worker's room for `credits` more jobs (`replace`: exactly `credits`)."""

    worker_id: str
    credits: int
    replace: bool = False

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.grant_credit(self.worker_id, self.credits, now, replace=self.replace)

    def answer(self, core: Dispatcher, events: list[Event]) -> None:
        return None


@dataclass(frozen=True, slots=True)
class WorkerAlive(LoopCommand[None]):
    worker_id: str

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.worker_heartbeat(self.worker_id, now)

    def answer(self, core: Dispatcher, events: list[Event]) -> None:
        return None


@dataclass(frozen=True, slots=True)
class LoseWorker(LoopCommand[None]):
    """The worker is gone (its socket closed): its running jobs go back to their queues."""

    worker_id: str
    reason: str

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.lose_worker(self.worker_id, now, reason=self.reason)

    def answer(self, core: Dispatcher, events: list[Event]) -> None:
        return None


# --- settling an attempt -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AckJob(LoopCommand[JobView | None]):
    """The attempt succeeded with `result`; answers the job's view (None: unknown)."""

    job_id: str
    attempt: int
    lease: str
    result: Any = None
    worker_id: str | None = None
    owner: str | None = None

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.ack(
            self.job_id, self.attempt, self.lease, now,
            result=self.result, worker_id=self.worker_id, owner=self.owner,
        )  # fmt: skip

    def answer(self, core: Dispatcher, events: list[Event]) -> JobView | None:
        return view_of(core, self.job_id)


@dataclass(frozen=True, slots=True)
class FailJob(LoopCommand[JobView | None]):
    """The attempt failed (`retryable`: it may run again, after its retry delay, or after
    `retry_after_s` when the worker gives one)."""

    job_id: str
    attempt: int
    lease: str
    error: str = ""
    retryable: bool = True
    worker_id: str | None = None
    owner: str | None = None
    retry_after_s: float | None = None

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.fail(
            self.job_id, self.attempt, self.lease, now, error=self.error,
            retryable=self.retryable, worker_id=self.worker_id, owner=self.owner,
            retry_after_s=self.retry_after_s,
        )  # fmt: skip

    def answer(self, core: Dispatcher, events: list[Event]) -> JobView | None:
        return view_of(core, self.job_id)


@dataclass(frozen=True, slots=True)
class ExtendAttempt(LoopCommand[JobView | None]):
    """A running attempt's heartbeat: its deadline moves on."""

    job_id: str
    attempt: int
    lease: str
    worker_id: str | None = None
    owner: str | None = None
    progress: dict[str, Any] | None = None

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.heartbeat(
            self.job_id, self.attempt, self.lease, now, worker_id=self.worker_id,
            owner=self.owner, progress=self.progress,
        )  # fmt: skip

    def answer(self, core: Dispatcher, events: list[Event]) -> JobView | None:
        return view_of(core, self.job_id)


@dataclass(frozen=True, slots=True)
class AckOutcome:
    """One ack of many: the job's status after it, or why it was refused."""

    job_id: str
    status: str | None = None
    refused: Rejected | None = None

    def to_dict(self) -> dict[str, Any]:
        """As a settlement answer says it (REST `Settled`, WebSocket `settled_many`)."""
        if self.refused is None:
            return {"id": self.job_id, "status": self.status}
        return {"id": self.job_id, "error": self.refused.code.value, "detail": self.refused.detail}


@dataclass(frozen=True, slots=True)
class AckMany(LoopCommand[list[AckOutcome]]):
    """Many acks in one command, each naming the worker it comes from; each is answered on
    its own, in the order given (a stale one does not stop the others, nor does one naming
    another worker than the job's)."""

    acks: Sequence[tuple[str | None, AckItem]]
    owner: str | None = None
    _refused: dict[str, Rejected] = field(default_factory=dict, init=False, repr=False)
    """Filled by `decide`, read by `answer` (the same command object, on the loop thread)."""

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        by_worker: dict[str | None, list[AckItem]] = {}
        for worker_id, item in self.acks:
            by_worker.setdefault(worker_id, []).append(item)
        events: list[Event] = []
        for worker_id, items in by_worker.items():
            settled, rejections = core.ack_many(items, now, worker_id=worker_id, owner=self.owner)
            events += settled
            self._refused.update({rejection.job_id or "": rejection for rejection in rejections})
        return events

    def answer(self, core: Dispatcher, events: list[Event]) -> list[AckOutcome]:
        outcomes = []
        for _worker_id, (job_id, _attempt, _lease, _result) in self.acks:
            refused = self._refused.get(job_id)
            if refused is not None:
                outcomes.append(AckOutcome(job_id, refused=refused))
            else:
                job = core.job_view(job_id)
                outcomes.append(AckOutcome(job_id, job.status.value if job else None))
        return outcomes

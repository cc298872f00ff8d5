"""Client commands: submit, cancel (one job, or many by a filter), redrive.

A submission of a known id does nothing (dedup). A client may create at most
`MAX_EXEC_QUEUES_PER_CLIENT` exec queues: `submit` refuses one more, `submit_many` leaves it
out, and `exec_queues_refusal` answers a submitter early, before it writes to the log.
"""

from __future__ import annotations

from collections.abc import Iterable

from dispatch.core import _validate as v
from dispatch.core.commands import SubmitRequest
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import Cancelled, CancelRequested, Event, Redriven
from dispatch.core.fast_events import new_enqueued
from dispatch.core.job import JobRecord, JobStatus
from dispatch.core.queues import MAX_EXEC_QUEUES_PER_CLIENT
from dispatch.core.scheduler import Scheduler
from dispatch.core.state import DispatcherState
from dispatch.core.subjects import compile_pattern, match_tokens

MAX_CANCEL_BATCH = 10_000
"""Most jobs one `cancel_where` call cancels (the rest wait for the next call)."""
MAX_REASON_LENGTH = 1_000
"""Longest reason a cancel may record."""


class ClientCommands:
    """What a client (or the leader's submission reader) asks of the dispatcher."""

    def __init__(self, state: DispatcherState, scheduler: Scheduler) -> None:
        self._state = state
        self._scheduler = scheduler

    def submit(self, request: SubmitRequest, now: float, *, dispatch: bool = True) -> list[Event]:
        """Enqueue a job (`enqueued`), unless its id is already known: then nothing happens
        and [] is returned (read the existing job with `job(id)`). Rejected INVALID when it
        would create one exec queue more than its client may (MAX_EXEC_QUEUES_PER_CLIENT)."""
        state = self._state
        jobs = state._jobs
        if request.id not in jobs:
            refusal = self._exec_refusal(request)
            if refusal is not None:
                raise Rejected(RejectCode.INVALID, refusal, job_id=request.id)
        now = float(now)
        if now > state._clock:
            state._advance(now)
        now = state._clock
        out: list[Event] = []
        if request.id not in jobs:
            self._enqueue(request, now, out)
            if dispatch and state._rotation:
                self._scheduler.assignment_pass(now, out)
        return out

    def submit_many(
        self,
        requests: Iterable[SubmitRequest],
        now: float,
        *,
        refused: list[tuple[SubmitRequest, str]] | None = None,
    ) -> list[Event]:
        """Submit many jobs, then run one assignment pass. Duplicates are skipped. A job
        `submit` would reject (one exec queue too many for its client) is left out, and
        appended to `refused` with the reason, if given; the others are enqueued (this is
        the leader's path for `dispatch.submit` records, where one bad record must not
        stop the rest)."""
        state = self._state
        now = state.advance_to(now)
        out: list[Event] = []
        jobs = state._jobs
        exec_refusal = self._exec_refusal
        enqueue = self._enqueue
        for request in requests:
            if request.id in jobs:
                continue
            refusal = exec_refusal(request)
            if refusal is not None:
                if refused is not None:
                    refused.append((request, refusal))
                continue
            enqueue(request, now, out)
        self._scheduler.assignment_pass(now, out)
        return out

    def exec_queues_refusal(self, requests: Iterable[SubmitRequest]) -> str | None:
        """Why these submissions, together, would create more exec queues than one of their
        clients may have, or None. For a submitter's early answer (the REST path asks before
        writing to Kafka, so a client learns it at once, not from a rejection record); the
        leader's `submit_many` decides for good."""
        state = self._state
        new_by_client: dict[str, set[str]] = {}
        for request in requests:
            if request.exec not in state._queues:
                new_by_client.setdefault(request.client_id, set()).add(request.exec)
        for client_id, execs in new_by_client.items():
            client = state._clients.get(client_id)
            created = 0 if client is None else client.exec_queues
            if created + len(execs) > MAX_EXEC_QUEUES_PER_CLIENT:
                return (
                    f"exec: client {client_id!r} has created {created} exec queues and these "
                    f"jobs would add {len(execs)}, over the most one client may "
                    f"({MAX_EXEC_QUEUES_PER_CLIENT}); use an existing exec name"
                )
        return None

    def _exec_refusal(self, request: SubmitRequest) -> str | None:
        """Why `request` may not create its exec queue, or None (the queue exists, or its
        client may create one more)."""
        state = self._state
        if request.exec in state._queues:
            return None
        client = state._clients.get(request.client_id)
        if client is None or client.exec_queues < MAX_EXEC_QUEUES_PER_CLIENT:
            return None
        return (
            f"exec {request.exec!r}: client {request.client_id!r} already created "
            f"{client.exec_queues} exec queues, the most one client may "
            f"({MAX_EXEC_QUEUES_PER_CLIENT}); use an existing exec name"
        )

    def _enqueue(self, request: SubmitRequest, now: float, out: list[Event]) -> None:
        state = self._state
        config = state.config
        not_before = request.not_before
        if request.delay_s:
            not_before = now + request.delay_s
        elif not_before is not None and not_before <= now:
            not_before = None
        # The job's own policy is completed from its exec's default now, so it keeps the
        # policy it was accepted with; a job without one follows the settings of the day.
        retry = None
        if request.retry is not None:
            retry = config.retry_for(request.exec).merged(request.retry)
        expires_at = request.expires_at
        if request.ttl_s is not None:
            expires_at = now + request.ttl_s
        event = new_enqueued(
            state.fence.epoch,
            now,
            request.id,
            request.client_id,
            request.exec,
            request.payload,
            request.max_attempts or config.max_attempts,
            request.timeout_s or config.ack_timeout_s,
            request.priority,
            not_before,
            state._next_seq,
            retry,
            expires_at,
            request.max_run_s or config.max_run_for(request.exec),
            request.key,
        )
        state._on_enqueued(event)
        out.append(event)

    def cancel(
        self, job_id: str, now: float, *, by: str | None = None, reason: str = ""
    ) -> list[Event]:
        """Cancel a job. Queued (ready or delayed): it ends `cancelled` at once. Running:
        its worker is told to stop (`cancel_requested`, its deadline cut to at most
        `cancel_grace_s` away); it ends `cancelled` when the worker confirms or at that
        deadline. Asking again for a running job answers []. Finished jobs refuse
        (`not_cancellable`). `by` names the API key asking (recorded in the event)."""
        job = self._scheduler.known_job(job_id)
        reason = _checked_reason(reason, job_id)
        by = checked_by(by, job_id)
        state = self._state
        if job.status is JobStatus.RUNNING:
            if job.cancel_requested_at is not None:
                return []
            now = state.advance_to(now)
            out: list[Event] = []
            self._request_cancel(job, now, by, reason, out)
            return out
        if job.status is not JobStatus.QUEUED:
            raise Rejected(
                RejectCode.NOT_CANCELLABLE,
                f"job {job_id!r} is {job.status.value}; only queued and running jobs can be "
                "cancelled",
                job_id=job_id,
            )
        now = state.advance_to(now)
        out = []
        cancelled = Cancelled(epoch=state.fence.epoch, at=now, job_id=job_id, by=by, reason=reason)
        state.emit(cancelled, out)
        return out

    def _request_cancel(
        self, job: JobRecord, now: float, by: str | None, reason: str, out: list[Event]
    ) -> None:
        state = self._state
        assert job.deadline is not None and job.worker_id is not None  # running
        deadline = min(job.deadline, now + state.config.cancel_grace_s)
        event = CancelRequested(
            epoch=state.fence.epoch, at=now, job_id=job.id, worker_id=job.worker_id,
            attempt=job.attempts, deadline=deadline, by=by, reason=reason,
        )  # fmt: skip
        state.emit(event, out)

    def cancel_where(
        self,
        now: float,
        *,
        exec_pattern: str | None = None,
        client_id: str | None = None,
        statuses: frozenset[JobStatus] = frozenset({JobStatus.QUEUED, JobStatus.RUNNING}),
        limit: int = MAX_CANCEL_BATCH,
        by: str | None = None,
        reason: str = "",
    ) -> list[Event]:
        """Cancel up to `limit` jobs whose exec matches `exec_pattern` (`*` one token, a
        final `>` one or more; None: any), of `client_id` (None: any), in `statuses`
        (queued and/or running), oldest submission first, each as `cancel` does (a running
        job whose cancel was already requested is skipped and not counted). Purging a queue
        is `statuses={queued}`. Cost: one pass over the jobs held."""
        try:
            tokens = None if exec_pattern is None else compile_pattern(exec_pattern)
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise ValueError(f"limit: expected an integer, got {limit!r}")
            if not 1 <= limit <= MAX_CANCEL_BATCH:
                raise ValueError(f"limit: expected an integer in [1, {MAX_CANCEL_BATCH}]")
            allowed = {JobStatus.QUEUED, JobStatus.RUNNING}
            if not statuses or not set(statuses) <= allowed:
                raise ValueError("status: expected queued and/or running")
        except ValueError as error:
            raise Rejected(RejectCode.INVALID, str(error)) from None
        reason = _checked_reason(reason, None)
        by = checked_by(by, None)
        state = self._state
        now = state.advance_to(now)
        chosen: list[JobRecord] = []
        for job in state._jobs.values():
            if job.status not in statuses or (
                job.status is JobStatus.RUNNING and job.cancel_requested_at is not None
            ):
                continue
            if client_id is not None and job.client_id != client_id:
                continue
            if tokens is not None and not match_tokens(tokens, tuple(job.exec.split("."))):
                continue
            chosen.append(job)
        chosen.sort(key=lambda job: (job.submitted_at, job.id))
        out: list[Event] = []
        epoch = state.fence.epoch
        for job in chosen[:limit]:
            if job.status is JobStatus.RUNNING:
                self._request_cancel(job, now, by, reason, out)
            else:
                event = Cancelled(epoch=epoch, at=now, job_id=job.id, by=by, reason=reason)
                state.emit(event, out)
        return out

    def redrive(self, job_id: str, now: float, *, by: str | None = None) -> list[Event]:
        """Requeue a dead-lettered job with its attempts reset to 0. `by` names the API key
        asking (recorded in the event)."""
        scheduler = self._scheduler
        job = scheduler.known_job(job_id)
        by = checked_by(by, job_id)
        if job.status is not JobStatus.DEAD:
            raise Rejected(
                RejectCode.NOT_DEAD,
                f"job {job_id!r} is {job.status.value}; only dead jobs can be redriven",
                job_id=job_id,
            )
        state = self._state
        now = state.advance_to(now)
        out: list[Event] = []
        redriven = Redriven(
            epoch=state.fence.epoch, at=now, job_id=job_id, seq=state._next_seq, by=by
        )
        state.emit(redriven, out)
        scheduler.assignment_pass(now, out)
        return out


def checked_by(by: object, job_id: str | None) -> str | None:
    """None, or an API key's name: a non-empty string (an empty one would not survive the
    event's round trip, which leaves out an unset `by`)."""
    try:
        return v.as_opt_id(by, "by")
    except ValueError as error:
        raise Rejected(RejectCode.INVALID, str(error), job_id=job_id) from None


def _checked_reason(reason: object, job_id: str | None) -> str:
    if not isinstance(reason, str) or len(reason) > MAX_REASON_LENGTH:
        raise Rejected(
            RejectCode.INVALID,
            f"reason: expected a string of at most {MAX_REASON_LENGTH} characters",
            job_id=job_id,
        )
    return reason

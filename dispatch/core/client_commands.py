"""Client commands: submit, cancel, redrive.

A submission of a known id does nothing (dedup). A client may create at most
`MAX_EXEC_QUEUES_PER_CLIENT` exec queues: `submit` refuses one more, `submit_many` leaves it
out, and `exec_queues_refusal` answers a submitter early, before it writes to the log.
"""

from __future__ import annotations

from collections.abc import Iterable

from dispatch.core.commands import SubmitRequest
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import Cancelled, Event, Redriven
from dispatch.core.fast_events import new_enqueued
from dispatch.core.job import JobStatus
from dispatch.core.queues import MAX_EXEC_QUEUES_PER_CLIENT
from dispatch.core.scheduler import Scheduler
from dispatch.core.state import DispatcherState


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
        )
        state._on_enqueued(event)
        out.append(event)

    def cancel(self, job_id: str, now: float) -> list[Event]:
        """Cancel a queued (ready or delayed) job. Running and finished jobs refuse."""
        job = self._scheduler.known_job(job_id)
        if job.status is not JobStatus.QUEUED:
            raise Rejected(
                RejectCode.NOT_CANCELLABLE,
                f"job {job_id!r} is {job.status.value}; only queued jobs can be cancelled",
                job_id=job_id,
            )
        state = self._state
        now = state.advance_to(now)
        out: list[Event] = []
        state.emit(Cancelled(epoch=state.fence.epoch, at=now, job_id=job_id), out)
        return out

    def redrive(self, job_id: str, now: float) -> list[Event]:
        """Requeue a dead-lettered job with its attempts reset to 0."""
        scheduler = self._scheduler
        job = scheduler.known_job(job_id)
        if job.status is not JobStatus.DEAD:
            raise Rejected(
                RejectCode.NOT_DEAD,
                f"job {job_id!r} is {job.status.value}; only dead jobs can be redriven",
                job_id=job_id,
            )
        state = self._state
        now = state.advance_to(now)
        out: list[Event] = []
        redriven = Redriven(epoch=state.fence.epoch, at=now, job_id=job_id, seq=state._next_seq)
        state.emit(redriven, out)
        scheduler.assignment_pass(now, out)
        return out

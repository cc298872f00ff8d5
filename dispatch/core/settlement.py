"""Settling assignments: ack, fail and heartbeat, keyed by (job id, attempt, lease).

A settlement for the job's current assignment applies; the exact repeat of one that already
applied (same attempt and lease, same outcome) answers with no events, so a worker may retry
safely; anything else is refused: `stale_lease` when the attempt/lease is not the job's
latest, `already_settled` when it is but that attempt ended another way.

A lease is bound to the worker that holds it. `worker_id=` (the settling worker) must be the
job's worker, and `owner=` (the name of the API key settling) must be the owner recorded for
the job's worker when one is recorded (a worker joined by an admin, or a placeholder after a
restore, has none: the unguessable lease alone decides). A settlement failing either check
is `stale_lease`, worded exactly as for a wrong lease when `owner` is given, so a worker key
probing other workers' jobs learns nothing, not even who holds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import (
    Cancelled,
    DeadLettered,
    Event,
    JobHeartbeat,
    Requeued,
)
from dispatch.core.fast_events import new_completed
from dispatch.core.job import DeadReason, JobRecord, JobStatus, RequeueReason
from dispatch.core.progress import PROGRESS_EVERY_S, check_progress
from dispatch.core.retry import check_retry_after
from dispatch.core.scheduler import Scheduler
from dispatch.core.state import DispatcherState

_RUNNING = JobStatus.RUNNING


class SettlementCommands:
    """What a worker reports about a job it holds."""

    def __init__(self, state: DispatcherState, scheduler: Scheduler) -> None:
        self._state = state
        self._scheduler = scheduler

    def _foreign(self, job: JobRecord, owner: str) -> bool:
        """Whether the job's worker is live and registered by a key other than `owner`."""
        worker = self._state._workers.get(job.worker_id or "")
        return worker is not None and worker.owner is not None and worker.owner != owner

    def _current(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        worker_id: str | None,
        *,
        owner: str | None = None,
        repeat_of: JobStatus | None,
        repeat_reasons: frozenset[DeadReason] = frozenset(),
    ) -> JobRecord | None:
        """The job if (attempt, lease, worker, owner) is its current assignment; None if this
        exact settlement was already applied (an idempotent repeat); Rejected otherwise."""
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise Rejected(
                RejectCode.INVALID, f"attempt: expected an integer >= 1, got {attempt!r}"
            )
        if not isinstance(lease, str) or not lease:
            raise Rejected(RejectCode.INVALID, f"lease: expected a non-empty string, got {lease!r}")
        job = self._scheduler.known_job(job_id)
        same_assignment = (
            attempt == job.attempts
            and lease == job.lease
            and (worker_id is None or worker_id == job.worker_id)
            and (owner is None or not self._foreign(job, owner))
        )
        if same_assignment:
            if job.status is _RUNNING:
                return job
            if job.status is repeat_of and (
                repeat_of is not JobStatus.DEAD or job.dead_reason in repeat_reasons
            ):
                return None
            outcome = job.status.value
            if job.dead_reason is not None:
                outcome += f" ({job.dead_reason.value})"
            raise Rejected(
                RejectCode.ALREADY_SETTLED,
                f"attempt {attempt} of job {job_id!r} has already ended: the job is {outcome}",
                job_id=job_id,
            )
        refusal = (
            f"attempt {attempt} with lease {lease!r}"
            + (f" by worker {worker_id!r}" if worker_id is not None else "")
            + f" does not hold job {job_id!r}"
        )
        if owner is None:
            # An admin (or a caller that did not say who it is) may see who holds the job;
            # a worker key may not.
            if job.status is _RUNNING:
                holder = f"attempt {job.attempts} by worker {job.worker_id!r}"
            else:
                holder = f"no attempt (the job is {job.status.value})"
            refusal += f"; it is held by {holder}"
        raise Rejected(RejectCode.STALE_LEASE, refusal, job_id=job_id)

    def ack(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        now: float,
        *,
        result: Any = None,
        worker_id: str | None = None,
        owner: str | None = None,
    ) -> list[Event]:
        """The worker finished the job (`completed`, with its result). Repeating the same ack
        after success returns [] (read the outcome with `job(id)`). `worker_id` and `owner`,
        when given, must be the job's worker and its key (see the module's doc)."""
        state = self._state
        job = state._jobs.get(job_id)
        if (
            job is None
            or job.status is not _RUNNING
            or attempt != job.attempts
            or lease != job.lease
            or (worker_id is not None and worker_id != job.worker_id)
            or (owner is not None and self._foreign(job, owner))
        ):
            job = self._current(
                job_id, attempt, lease, worker_id, owner=owner, repeat_of=JobStatus.SUCCEEDED
            )
            if job is None:
                return []
        now = float(now)
        if now > state._clock:
            state._advance(now)
        now = state._clock
        event = new_completed(
            state.fence.epoch, now, job_id, job.worker_id or "", attempt, lease, result
        )
        state._on_completed(event)
        out: list[Event] = [event]
        if state._rotation:
            self._scheduler.assignment_pass(now, out)
        return out

    def ack_many(
        self,
        acks: Iterable[tuple[str, int, str, Any]],
        now: float,
        *,
        worker_id: str | None = None,
        owner: str | None = None,
    ) -> tuple[list[Event], list[Rejected]]:
        """Settle many successes at once: `acks` holds (job_id, attempt, lease, result), all
        from `worker_id` (and the key `owner`) when given (an ack for another worker's or
        another key's assignment is refused as stale, as `ack` refuses it).

        Returns (events, rejections): one `completed` per accepted ack (none for idempotent
        repeats), then the assignments of a single pass; an invalid ack does not stop the
        others, its `Rejected` (with `job_id`) is in the second list.
        """
        state = self._state
        now = float(now)
        if now > state._clock:
            state._advance(now)
        now = state._clock
        epoch = state.fence.epoch
        jobs = state._jobs
        on_completed = state._on_completed
        foreign = self._foreign
        out: list[Event] = []
        rejected: list[Rejected] = []
        for job_id, attempt, lease, result in acks:
            job = jobs.get(job_id)
            if (
                job is None
                or job.status is not _RUNNING
                or attempt != job.attempts
                or lease != job.lease
                or (worker_id is not None and worker_id != job.worker_id)
                or (owner is not None and foreign(job, owner))
            ):
                try:
                    job = self._current(
                        job_id,
                        attempt,
                        lease,
                        worker_id,
                        owner=owner,
                        repeat_of=JobStatus.SUCCEEDED,
                    )
                except Rejected as rejection:
                    rejected.append(rejection)
                    continue
                if job is None:
                    continue
            event = new_completed(epoch, now, job_id, job.worker_id or "", attempt, lease, result)
            on_completed(event)
            out.append(event)
        if state._rotation:
            self._scheduler.assignment_pass(now, out)
        return out, rejected

    def fail(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        now: float,
        *,
        error: str = "",
        retryable: bool = True,
        worker_id: str | None = None,
        owner: str | None = None,
        retry_after_s: float | None = None,
    ) -> list[Event]:
        """The attempt failed. Permanent: dead-letter at once. Retryable: requeue (in front of
        its client's later jobs) for attempt + 1, not runnable before its retry delay
        (`retry_after_s` if the worker gave one, else the job's retry policy), or dead-letter
        if no attempt is left. Repeating a failure that dead-lettered the job returns [].

        A job whose cancel was requested ends `cancelled` instead, whatever the failure: its
        worker stopped it, as asked."""
        try:
            retry_after_s = check_retry_after(retry_after_s)
        except ValueError as problem:
            raise Rejected(RejectCode.INVALID, str(problem), job_id=job_id) from None
        repeat = frozenset({DeadReason.PERMANENT_FAILURE, DeadReason.RETRIES_EXHAUSTED})
        job = self._current(
            job_id,
            attempt,
            lease,
            worker_id,
            owner=owner,
            repeat_of=JobStatus.DEAD,
            repeat_reasons=repeat,
        )
        if job is None:
            return []
        state = self._state
        now = state.advance_to(now)
        holder = job.worker_id or ""
        out: list[Event] = []
        event: Event
        if job.cancel_requested_at is not None:
            reason = f"{job.error}; the worker stopped"
            event = Cancelled(
                epoch=state.fence.epoch, at=now, job_id=job_id, worker_id=holder,
                attempt=attempt, reason=f"{reason}: {error}" if error else reason,
            )  # fmt: skip
        elif not retryable or job.attempts >= job.max_attempts:
            reason = DeadReason.RETRIES_EXHAUSTED if retryable else DeadReason.PERMANENT_FAILURE
            event = DeadLettered(
                epoch=state.fence.epoch,
                at=now,
                job_id=job_id,
                reason=reason,
                worker_id=holder,
                attempt=attempt,
                error=error,
            )
        else:
            event = Requeued(
                epoch=state.fence.epoch,
                at=now,
                job_id=job_id,
                reason=RequeueReason.FAILED,
                worker_id=holder,
                attempt=attempt,
                error=error,
                seq=state._front_seq,
                not_before=self._scheduler.retry_at(job, now, retry_after_s),
                retry_after_s=retry_after_s,
            )
        state.emit(event, out)
        self._scheduler.assignment_pass(now, out)
        return out

    def heartbeat(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        now: float,
        *,
        worker_id: str | None = None,
        owner: str | None = None,
        progress: Mapping[str, Any] | None = None,
    ) -> list[Event]:
        """The worker is still on the job: its deadline becomes now + the attempt's timeout
        (never earlier than it was), but never past the attempt's hard time limit
        (`run_limit_at`), and not at all once a cancel was requested (the worker has its
        grace to stop, no more). Also counts as the worker's heartbeat.

        `progress` (`{done, total, message}`, see `dispatch.core.progress`) becomes the job's
        latest progress, unless the last one kept is less than PROGRESS_EVERY_S old (then
        the heartbeat is applied without it)."""
        if progress is not None:
            try:
                progress = check_progress(progress)
            except ValueError as problem:
                raise Rejected(RejectCode.INVALID, str(problem), job_id=job_id) from None
        job = self._current(job_id, attempt, lease, worker_id, owner=owner, repeat_of=None)
        assert job is not None and job.deadline is not None  # a running job has a deadline
        state = self._state
        now = state.advance_to(now)
        extended = now + state.config.ack_timeout(job.timeout_s, job.attempts)
        if job.run_limit_at is not None and job.run_limit_at < extended:
            extended = job.run_limit_at
        if job.cancel_requested_at is not None:
            extended = job.deadline
        last = job.progress
        if progress is not None and last is not None and now - last["at"] < PROGRESS_EVERY_S:
            progress = None
        out: list[Event] = []
        event = JobHeartbeat(
            epoch=state.fence.epoch,
            at=now,
            job_id=job_id,
            worker_id=job.worker_id or "",
            attempt=attempt,
            lease=lease,
            deadline=max(job.deadline, extended),
            progress=progress,
        )
        state.emit(event, out)
        return out

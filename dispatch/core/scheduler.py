"""The scheduler's decisions: assignment passes, deadlines, silent and lost workers.

`Scheduler` is the part of the `Dispatcher` every command builds on. A command validates its
request, decides events, folds each through the same handlers `apply` uses
(`DispatcherState.emit`) and returns them, usually after an `assignment_pass`. It takes
`now` (unix seconds) from the caller; the core never reads a clock, and its one random
input, the token of each new lease, comes from the source the dispatcher was given
(`leases`), so the same inputs (and tokens) give the same events. Time never goes back: a
`now` older than the latest time seen is treated as that time.
"""

from __future__ import annotations

from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import (
    Cancelled,
    DeadLettered,
    Event,
    Expired,
    Reassigned,
    Requeued,
    WorkerLost,
)
from dispatch.core.fast_events import new_assigned
from dispatch.core.job import DeadReason, JobRecord, JobStatus, RequeueReason
from dispatch.core.queues import ExecQueue
from dispatch.core.state import DispatcherState
from dispatch.core.workers import WorkerState, pick_worker

_RUNNING = JobStatus.RUNNING


class Scheduler:
    """Decisions shared by all commands, over the state it is given."""

    def __init__(self, state: DispatcherState) -> None:
        self._state = state

    # --- shared by the commands --------------------------------------------------------------

    def lease(self) -> str:
        """A new lease: the deciding epoch and 128 random bits (see `leases`)."""
        state = self._state
        return f"{state.fence.epoch}.{state._lease_token()}"

    def matching(self, queue: ExecQueue) -> list[WorkerState]:
        """The workers whose subjects match the queue's (cached on the queue until workers
        or their subjects change)."""
        workers = queue.workers
        if workers is None:
            subject = queue.subject
            workers = queue.workers = [
                w for w in self._state._workers.values() if w.matches(subject)
            ]
        return workers

    def known_job(self, job_id: str) -> JobRecord:
        """The job; Rejected NOT_FOUND if it is not held."""
        job = self._state._jobs.get(job_id)
        if job is None:
            raise Rejected(RejectCode.NOT_FOUND, f"no job {job_id!r}", job_id=job_id)
        return job

    def known_worker(self, worker_id: str) -> WorkerState:
        """The worker; Rejected UNKNOWN_WORKER if it has not joined."""
        worker = self._state._workers.get(worker_id)
        if worker is None:
            raise Rejected(RejectCode.UNKNOWN_WORKER, f"worker {worker_id!r} has not joined")
        return worker

    def retry_at(
        self, job: JobRecord, now: float, retry_after_s: float | None = None
    ) -> float | None:
        """When the job's next attempt may start after its current one failed at `now`: the
        worker's own `retry_after_s` if given, else its retry policy's delay (the job's own,
        or its exec's default); None when that delay is 0 (at once)."""
        if retry_after_s is None:
            policy = job.retry or self._state.config.retry_for(job.exec)
            delay = policy.delay(job.id, job.attempts)
        else:
            delay = retry_after_s
        return now + delay if delay > 0 else None

    def expire_due(self, now: float, out: list[Event]) -> None:
        """End every queued job whose `expires_at` has come (`expired`): it never runs."""
        state = self._state
        epoch = state.fence.epoch
        for job in state._job_expiry.pop_due(now):
            reason = f"expired at {job.expires_at:.3f} before attempt {job.attempts + 1} started"
            state.emit(Expired(epoch=epoch, at=now, job_id=job.id, reason=reason), out)

    def lose(self, worker: WorkerState, now: float, reason: str, out: list[Event]) -> None:
        """Requeue (or dead-letter, on their last attempt) the worker's jobs, then forget it."""
        state = self._state
        emit = state.emit
        epoch = state.fence.epoch
        error = f"worker {worker.worker_id} lost: {reason}"
        # Latest assignment first: each requeue goes in front of the previous one, so the
        # job assigned earliest ends up first in line.
        for job in reversed(list(worker.running.values())):
            event: Event
            if job.cancel_requested_at is not None:
                # Asked to stop, and gone before it confirmed: nothing is left to run.
                event = Cancelled(
                    epoch=epoch,
                    at=now,
                    job_id=job.id,
                    worker_id=worker.worker_id,
                    attempt=job.attempts,
                    reason=f"{job.error}; {error} before it confirmed it stopped",
                )
            elif job.attempts >= job.max_attempts:
                event = DeadLettered(
                    epoch=epoch,
                    at=now,
                    job_id=job.id,
                    reason=DeadReason.WORKER_LOST,
                    worker_id=worker.worker_id,
                    attempt=job.attempts,
                    error=error,
                )
            else:
                event = Requeued(
                    epoch=epoch,
                    at=now,
                    job_id=job.id,
                    reason=RequeueReason.WORKER_LOST,
                    worker_id=worker.worker_id,
                    attempt=job.attempts,
                    error=error,
                    seq=state._front_seq,
                )
            emit(event, out)
        emit(WorkerLost(epoch=epoch, at=now, worker_id=worker.worker_id, reason=reason), out)

    # --- time and assignment ---------------------------------------------------------------

    def tick(self, now: float) -> list[Event]:
        """Advance time to `now`: release delayed jobs, lose silent workers (requeueing their
        jobs), handle passed deadlines (reassign or dead-letter), then run an assignment pass.
        Cost: proportional to what is due, not to the number of jobs held."""
        state = self._state
        now = state.advance_to(now)
        out: list[Event] = []
        expiry_s = state.config.worker_expiry_s
        expiry = state._expiry
        if expiry_s is not None and expiry.heap and expiry.heap[0][0] <= now:
            for worker in expiry.pop_silent(now, expiry_s, state._workers):
                self.lose(worker, now, f"silent for {expiry_s:g}s", out)
        deadlines = state._deadlines
        if deadlines.heap and deadlines.heap[0][0] <= now:
            for job in deadlines.pop_expired(now):
                # Checked again here: the heap may hold two live-looking entries for one
                # job (a redriven job assigned again at the same instant gets the same
                # deadline), and the first `_expire` already moved it on (requeued, or
                # reassigned with a later deadline).
                if job.status is _RUNNING and job.deadline is not None and job.deadline <= now:
                    self._expire(job, now, out)
        self.assignment_pass(now, out)
        return out

    def _expire(self, job: JobRecord, now: float, out: list[Event]) -> None:
        """The job's deadline passed: a failed attempt. Dead-letter it if that was its last
        attempt. If its retry policy gives a delay, it waits that long at the front of its
        queue (as after a retryable failure). Else reassign it at once, preferably to another
        matching worker with credit, else to the same worker if it has credit left, with
        attempt + 1; else (or if it has expired meanwhile) it waits at the front of its queue.

        The same worker spends a credit like any other: it may still be running the timed-out
        attempt (stuck, or slow), which holds its slot until the worker gives it back, so a
        new attempt on the old slot would make it hold more jobs than it has slots.

        A job whose cancel was requested ends `cancelled` (its grace passed). A deadline that
        was the attempt's hard limit (`run_limit_at` at or before it) ends the attempt as
        `time_limit` (`_stop_at_time_limit`); a deadline before it is an ordinary timeout."""
        state = self._state
        epoch = state.fence.epoch
        worker = state._workers[job.worker_id or ""]
        attempt = job.attempts
        if job.cancel_requested_at is not None:
            reason = (
                f"{job.error}; worker {worker.worker_id} did not confirm it stopped attempt "
                f"{attempt} within the cancel grace"
            )
            cancelled = Cancelled(
                epoch=epoch, at=now, job_id=job.id, worker_id=worker.worker_id,
                attempt=attempt, reason=reason,
            )  # fmt: skip
            state.emit(cancelled, out)
            return
        run_limit_at = job.run_limit_at
        if run_limit_at is not None and job.deadline is not None and run_limit_at <= job.deadline:
            # The deadline was the hard limit (or a failover's reconnect window past it), not
            # a missed heartbeat: decided on the record, however late the tick that sees it.
            self._stop_at_time_limit(job, worker.worker_id, now, out)
            return
        error = f"attempt {attempt} of {job.max_attempts} timed out on worker {worker.worker_id}"
        if attempt >= job.max_attempts:
            state.emit(
                DeadLettered(
                    epoch=epoch,
                    at=now,
                    job_id=job.id,
                    reason=DeadReason.ACK_TIMEOUT,
                    worker_id=worker.worker_id,
                    attempt=attempt,
                    error=error,
                ),
                out,
            )
            return
        retry_at = self.retry_at(job, now)
        queue = state._queues[job.exec]
        target = None
        expired = job.expires_at is not None and job.expires_at <= now
        # An expired job starts no new attempt: requeued, the pass that follows expires it.
        # Nor does a paused one: it waits at the front of its queue for the resume; nor one
        # a limit holds (no room, or no rate token, with the job counted out).
        held = queue.paused or not state.admits_again(job, queue, now)
        if retry_at is None and not expired and not held:
            target = pick_worker(self.matching(queue), exclude=worker)
            if target is None and worker.credit > 0 and worker.matches(queue.subject):
                target = worker
        if target is None:
            # Nobody has room for it now (or only a worker whose subjects changed, or a
            # placeholder after a restore, held it): it waits at the front of its queue.
            event: Event = Requeued(
                epoch=epoch,
                at=now,
                job_id=job.id,
                reason=RequeueReason.TIMEOUT,
                worker_id=worker.worker_id,
                attempt=attempt,
                error=error,
                seq=state._front_seq,
                not_before=retry_at,
            )
        else:
            event = Reassigned(
                epoch=epoch,
                at=now,
                job_id=job.id,
                worker_id=target.worker_id,
                previous_worker_id=worker.worker_id,
                attempt=attempt + 1,
                lease=self.lease(),
                deadline=now + self.first_window(job, attempt + 1),
            )
        state.emit(event, out)

    def first_window(self, job: JobRecord, attempt: int) -> float:
        """Seconds from the start of `attempt` to its first deadline: its ack timeout, or
        the job's hard time limit if that is shorter."""
        timeout = (
            job.timeout_s
            if attempt == 1
            else self._state.config.ack_timeout(job.timeout_s, attempt)
        )
        max_run = job.max_run_s
        return max_run if max_run is not None and max_run < timeout else timeout

    def _stop_at_time_limit(
        self, job: JobRecord, worker_id: str, now: float, out: list[Event]
    ) -> None:
        """The attempt ran for its whole `max_run_s`: a failed attempt (`time_limit`),
        retried after its retry delay if attempts are left, else dead-lettered. Its worker
        is told to stop (by the API, which sees the event)."""
        state = self._state
        attempt = job.attempts
        error = (
            f"attempt {attempt} of {job.max_attempts} reached its time limit of "
            f"{job.max_run_s:g}s on worker {worker_id}"
        )
        event: Event
        if attempt >= job.max_attempts:
            event = DeadLettered(
                epoch=state.fence.epoch, at=now, job_id=job.id, reason=DeadReason.TIME_LIMIT,
                worker_id=worker_id, attempt=attempt, error=error,
            )  # fmt: skip
        else:
            event = Requeued(
                epoch=state.fence.epoch, at=now, job_id=job.id,
                reason=RequeueReason.TIME_LIMIT, worker_id=worker_id, attempt=attempt,
                error=error, seq=state._front_seq, not_before=self.retry_at(job, now),
            )  # fmt: skip
        state.emit(event, out)

    def dispatch(self, now: float) -> list[Event]:
        """Run an assignment pass (after commands called with `dispatch=False`)."""
        now = self._state.advance_to(now)
        out: list[Event] = []
        self.assignment_pass(now, out)
        return out

    def assignment_pass(self, now: float, out: list[Event]) -> None:
        """Assign until no exec queue has both a ready job (of a client under its cap, not
        paused, with room in its limits) and a matching worker with credit (a paused exec
        queue serves nothing, nor one an exec limit holds). Exec
        queues take turns (round-robin); a queue found unservable leaves the rotation until a
        job, a worker, credit or a resume wakes it, so the pass costs O(assignments + queues
        that changed), not O(queues)."""
        state = self._state
        job_expiry = state._job_expiry.heap
        if job_expiry and job_expiry[0][0] <= now:
            # Before any assignment: a job is never started at or after its expiry.
            self.expire_due(now, out)
        rotation = state._rotation
        epoch = state.fence.epoch
        on_assigned = state._on_assigned
        lease_token = state._lease_token
        gates_admit = state.gates_admit
        while rotation:
            queue = rotation[0]
            worker = None
            if queue.ready and not queue.paused and (not queue.gates or gates_admit(queue, now)):
                workers = queue.workers
                if workers is None:
                    workers = self.matching(queue)
                worker = pick_worker(workers)
            job = queue.next_job(now, state) if worker is not None else None
            if worker is None or job is None:
                rotation.popleft()
                queue.in_rotation = False
                continue
            attempt = job.attempts + 1
            timeout = (
                job.timeout_s if attempt == 1 else state.config.ack_timeout(job.timeout_s, attempt)
            )
            max_run = job.max_run_s
            if max_run is not None and max_run < timeout:
                timeout = max_run
            event = new_assigned(
                epoch,
                now,
                job.id,
                worker.worker_id,
                attempt,
                f"{epoch}.{lease_token()}",
                now + timeout,
            )
            on_assigned(event)
            out.append(event)
            if rotation and rotation[0] is queue:
                rotation.rotate(-1)

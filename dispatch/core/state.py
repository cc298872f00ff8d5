"""The dispatcher's state and the fold of facts into it (`apply`).

`DispatcherState.apply(event)` is the one way state changes: the live leader's commands (see
`dispatch.core.dispatcher`) decide an event and fold it through the same handlers (`emit`); a
rebuild and tests fold logged events with `apply`. Job status changes go through the per-job
reducer (`dispatch.core.reducer`); this layer keeps the indexes around it consistent: exec
queues, workers and their credit, per-client in-flight counts, the deadline and delay heaps,
the DLQ.

Replay never decides anything, and tolerates one gap: a restored snapshot does not hold
worker credit, subjects or owners, so an event naming an unknown worker creates a placeholder
worker (no subjects, no credit, no known owner) and credit never goes below zero.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from dispatch.core import reducer
from dispatch.core.config import CoreConfig
from dispatch.core.errors import InvalidTransition
from dispatch.core.events import (
    Assigned,
    Cancelled,
    CancelRequested,
    Completed,
    CreditGranted,
    DeadLettered,
    Enqueued,
    Event,
    Expired,
    JobHeartbeat,
    LeaderElected,
    Paused,
    PauseScope,
    Pruned,
    Reassigned,
    Redriven,
    Requeued,
    Resumed,
    WorkerHeartbeat,
    WorkerJoined,
    WorkerLost,
)
from dispatch.core.fence import EpochFence
from dispatch.core.job import DeadReason, JobRecord, JobStatus, RequeueReason
from dispatch.core.leases import LeaseTokens, RandomLeaseTokens
from dispatch.core.queues import ClientState, ExecQueue, unpark
from dispatch.core.subjects import compile_pattern, match_tokens
from dispatch.core.timers import DeadlineHeap, DelayHeap, ExpiryHeap, JobExpiryHeap
from dispatch.core.workers import WorkerState

_QUEUED = JobStatus.QUEUED
_RUNNING = JobStatus.RUNNING
_QUEUED_KEY = "queued"
_RUNNING_KEY = "running"
# Outcomes reported by the worker itself (so they prove it is alive).
_WORKER_REPORTED_DEATHS = frozenset({DeadReason.PERMANENT_FAILURE, DeadReason.RETRIES_EXHAUSTED})


class DispatcherState:
    """All state of one dispatcher group, and `apply`. Not thread-safe: one caller at a time."""

    def __init__(
        self,
        config: CoreConfig | None = None,
        *,
        epoch: int = 0,
        lease_token: LeaseTokens | None = None,
    ) -> None:
        """`lease_token` draws the random part of each new lease (`leases.RandomLeaseTokens`
        by default; pass `leases.seeded_lease_tokens(seed)` for reproducible events). Only
        commands draw: folding an event reads the lease it carries."""
        self.config = config if config is not None else CoreConfig()
        self.fence = EpochFence(epoch)
        self._lease_token: LeaseTokens = (
            lease_token if lease_token is not None else RandomLeaseTokens()
        )
        self._jobs: dict[str, JobRecord] = {}
        self._workers: dict[str, WorkerState] = {}
        self._clients: dict[str, ClientState] = {}
        self._queues: dict[str, ExecQueue] = {}
        self._rotation: deque[ExecQueue] = deque()
        """Exec queues that may be servable, in round-robin order."""
        self._deadlines = DeadlineHeap()
        self._delays = DelayHeap()
        self._expiry = ExpiryHeap()
        self._job_expiry = JobExpiryHeap()
        """Queued jobs with an `expires_at`, by that time."""
        self._dead: dict[str, JobRecord] = {}
        """The dead-letter queue, in dead-lettering order."""
        self._finished: deque[JobRecord] = deque()
        """Succeeded and cancelled jobs in the order they finished (for `prune`)."""
        # Keyed by the status *value*: hashing a str is done in C, hashing an Enum member is not.
        self._counts: dict[str, int] = dict.fromkeys([status.value for status in JobStatus], 0)
        self._delayed = 0
        self._assign_seq = 0
        """Assignments and reassignments folded so far (a count for `state_view`; leases are
        random, see `leases`)."""
        self._next_seq = 1
        """Queue position of the next submission or redrive."""
        self._front_seq = -1
        """Queue position of the next requeue (ahead of everything queued so far)."""
        self._clock = 0.0
        """The latest time seen (command `now` or event `at`); never goes back."""
        self._pauses: dict[tuple[PauseScope, str], Paused] = {}
        """Pauses in force, by (scope, target), with the event that set each."""
        self._paused_execs: dict[str, tuple[str, ...]] = {}
        """The exec pauses in force: each pattern's tokens (checked for each new queue)."""
        self._handlers: dict[type[Event], Callable[[Any], None]] = {
            LeaderElected: self._on_leader_elected,
            Pruned: self._on_pruned,
            Paused: self._on_paused,
            Resumed: self._on_resumed,
            WorkerJoined: self._on_worker_joined,
            CreditGranted: self._on_credit_granted,
            WorkerHeartbeat: self._on_worker_heartbeat,
            WorkerLost: self._on_worker_lost,
            Enqueued: self._on_enqueued,
            Assigned: self._on_assigned,
            Reassigned: self._on_reassigned,
            JobHeartbeat: self._on_job_heartbeat,
            Completed: self._on_completed,
            Requeued: self._on_requeued,
            DeadLettered: self._on_dead_lettered,
            CancelRequested: self._on_cancel_requested,
            Cancelled: self._on_cancelled,
            Expired: self._on_expired,
            Redriven: self._on_redriven,
        }

    # --- folding facts -------------------------------------------------------------------

    def apply(self, event: Event) -> bool:
        """Fold one logged event. False when the epoch fence voids it (nothing changes).

        Raises InvalidTransition when the event contradicts the state (a corrupt or foreign
        log); the state is then unchanged.
        """
        if not self.fence.admit(event):
            return False
        if event.at > self._clock:
            self._advance(event.at)
        handler = self._handlers.get(type(event))
        if handler is None:
            raise InvalidTransition(f"not an event: {event!r}")
        handler(event)
        return True

    def apply_all(self, events: Iterable[Event]) -> int:
        """Fold events in order; returns how many the fence admitted."""
        return sum(1 for event in events if self.apply(event))

    def emit(self, event: Event, out: list[Event]) -> None:
        """Fold an event a command of this core decided, and append it to `out`."""
        # The same handlers as `apply`; the fence is skipped because this core's own epoch
        # is always admitted.
        self._handlers[type(event)](event)
        out.append(event)

    def advance_to(self, now: float) -> float:
        """Move the clock to `now` unless it is already later; returns the clock, the time a
        command given `now` happens at (time never goes back)."""
        now = float(now)
        if now > self._clock:
            self._advance(now)
        return self._clock

    def _advance(self, now: float) -> None:
        """Move the clock forward; delayed jobs whose time has come become ready."""
        self._clock = now
        delays = self._delays
        if delays.heap and delays.heap[0][0] <= now:
            for job in delays.pop_due(now):
                queue = self._queues[job.exec]
                queue.delayed -= 1
                self._delayed -= 1
                self._ready(job, queue)

    def _queue(self, exec_name: str) -> ExecQueue:
        queue = self._queues.get(exec_name)
        if queue is None:
            queue = self._queues[exec_name] = ExecQueue(exec_name)
            if self._paused_execs:
                queue.paused = self._exec_paused(queue.tokens)
        return queue

    def _client(self, client_id: str) -> ClientState:
        client = self._clients.get(client_id)
        if client is None:
            client = self._clients[client_id] = ClientState(
                client_id, self.config.cap_for(client_id)
            )
            if self._pauses and (PauseScope.CLIENT, client_id) in self._pauses:
                client.pause(True)
        return client

    def _exec_paused(self, tokens: tuple[str, ...]) -> bool:
        """Whether an exec pause in force matches the exec name `tokens`."""
        return any(match_tokens(pattern, tokens) for pattern in self._paused_execs.values())

    def _place(self, job: JobRecord, queue: ExecQueue) -> None:
        """Put a queued job where it waits: the delay heap or its lane."""
        not_before = job.not_before
        if not_before is not None and not_before > self._clock:
            self._delayed += 1
            queue.delayed += 1
            self._delays.push(job, self._delayed)
        else:
            self._ready(job, queue)

    def _ready(self, job: JobRecord, queue: ExecQueue) -> None:
        if queue.push(job, self._client(job.client_id)) and not queue.in_rotation:
            queue.in_rotation = True
            self._rotation.append(queue)

    def _is_delayed(self, job: JobRecord) -> bool:
        return job.not_before is not None and job.not_before > self._clock

    def _unpark(self, client: ClientState) -> None:
        """The client went under its cap: its parked lanes' queues are servable again."""
        for lane in unpark(client):
            queue = lane.level.queue
            if not queue.in_rotation:
                queue.in_rotation = True
                self._rotation.append(queue)

    def _wake(self, worker: WorkerState) -> None:
        """The worker can take jobs: every queue it matches that has ready jobs is servable."""
        for queue in self._queues.values():
            if not queue.in_rotation and queue.ready and worker.matches(queue.subject):
                queue.in_rotation = True
                self._rotation.append(queue)

    def _worker_for(self, worker_id: str, at: float) -> WorkerState:
        """The named worker; a placeholder if a restored snapshot did not know it."""
        worker = self._workers.get(worker_id)
        if worker is None:
            worker = self._add_worker(worker_id, (), at)
        return worker

    def _add_worker(
        self, worker_id: str, subjects: tuple[str, ...], at: float, owner: str | None = None
    ) -> WorkerState:
        worker = self._workers[worker_id] = WorkerState(worker_id, subjects, at, owner)
        expiry = self.config.worker_expiry_s
        if expiry is not None:
            self._expiry.push(at + expiry, worker)
        self._forget_matches()
        return worker

    def _forget_matches(self) -> None:
        for queue in self._queues.values():
            queue.workers = None

    def _bump_seq(self, seq: int) -> None:
        if seq >= self._next_seq:
            self._next_seq = seq + 1
        if seq <= self._front_seq:
            self._front_seq = seq - 1

    def _stop_running(self, job: JobRecord, worker_id: str, at: float, alive: bool) -> None:
        """Bookkeeping for a job that stopped running (before it is requeued or finished)."""
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.running.pop(job.id, None)
            if alive:
                worker.last_seen = at
        self._queues[job.exec].running -= 1
        self._counts[_RUNNING_KEY] -= 1
        client = self._clients[job.client_id]
        client.inflight -= 1
        if client.parked and client.inflight < client.room:
            self._unpark(client)

    # --- handlers: leader and workers ----------------------------------------------------

    def _on_leader_elected(self, event: LeaderElected) -> None:
        # The fence already raised the epoch; nothing else changes.
        pass

    def _on_pruned(self, event: Pruned) -> None:
        finished = self._finished
        jobs = self._jobs
        counts = self._counts
        while finished and finished[0].updated_at <= event.before:
            job = finished.popleft()
            if jobs.get(job.id) is job:
                del jobs[job.id]
                counts[job.status.value] -= 1

    def _on_paused(self, event: Paused) -> None:
        key = (event.scope, event.target)
        if key in self._pauses:
            raise InvalidTransition(f"paused {event.scope.value} {event.target!r} twice")
        if event.scope is PauseScope.CLIENT:
            self._pauses[key] = event
            # A client not seen yet is paused when it first appears (`_client`): no state
            # is kept for ids that only a pause named.
            client = self._clients.get(event.target)
            if client is not None:
                client.pause(True)
            return
        try:
            pattern = compile_pattern(event.target)
        except ValueError as error:
            raise InvalidTransition(f"paused exec {event.target!r}: {error}") from None
        self._pauses[key] = event
        self._paused_execs[event.target] = pattern
        for queue in self._queues.values():
            if not queue.paused and match_tokens(pattern, queue.tokens):
                queue.paused = True

    def _on_resumed(self, event: Resumed) -> None:
        key = (event.scope, event.target)
        if self._pauses.pop(key, None) is None:
            raise InvalidTransition(f"resumed {event.scope.value} {event.target!r}: not paused")
        if event.scope is PauseScope.CLIENT:
            client = self._clients.get(event.target)
            if client is not None:
                client.pause(False)
                if client.parked and client.inflight < client.room:
                    self._unpark(client)
            return
        pattern = self._paused_execs.pop(event.target)
        # Only the queues this pause held can change; each may still match another pause.
        for queue in self._queues.values():
            if queue.paused and match_tokens(pattern, queue.tokens):
                queue.paused = self._exec_paused(queue.tokens)
                if not queue.paused and queue.ready and not queue.in_rotation:
                    queue.in_rotation = True
                    self._rotation.append(queue)

    def _on_worker_joined(self, event: WorkerJoined) -> None:
        worker = self._workers.get(event.worker_id)
        if worker is None:
            worker = self._add_worker(event.worker_id, event.subjects, event.at, event.owner)
        else:
            worker.last_seen = event.at
            # A join without an owner (an admin's, or a log older than owners) keeps the one
            # recorded; the command refused a join by another owner before it was logged.
            if event.owner is not None:
                worker.owner = event.owner
            if worker.subjects != event.subjects:
                worker.set_subjects(event.subjects)
                self._forget_matches()
        if worker.credit > 0:
            self._wake(worker)

    def _on_credit_granted(self, event: CreditGranted) -> None:
        worker = self._worker_for(event.worker_id, event.at)
        worker.credit = event.credits if event.replace else worker.credit + event.credits
        worker.last_seen = event.at
        if worker.credit > 0:
            self._wake(worker)

    def _on_worker_heartbeat(self, event: WorkerHeartbeat) -> None:
        self._worker_for(event.worker_id, event.at).last_seen = event.at

    def _on_worker_lost(self, event: WorkerLost) -> None:
        worker = self._workers.get(event.worker_id)
        if worker is None:
            return
        if worker.running:
            raise InvalidTransition(
                f"worker_lost for {event.worker_id!r}, which still holds {len(worker.running)} "
                "job(s): their requeued/dead_lettered events must come first"
            )
        del self._workers[event.worker_id]
        self._forget_matches()

    # --- handlers: jobs ------------------------------------------------------------------

    def _on_enqueued(self, event: Enqueued) -> None:
        jobs = self._jobs
        previous = jobs.get(event.job_id)
        job = reducer.enqueued(previous, event)
        if previous is not None:
            # Only a snapshot holding a job the old leader had pruned gets here.
            self._counts[previous.status.value] -= 1
        # Share one string object per exec and client: it matters with a million jobs.
        client = self._clients.get(event.client_id) or self._client(event.client_id)
        queue = self._queues.get(event.exec)
        if queue is None:
            queue = self._queue(event.exec)
            # Counted in the fold, so a replayed log counts each client's queues like the
            # leader that wrote it (`submit` refuses one queue too many).
            client.exec_queues += 1
        job.exec = queue.exec
        job.client_id = client.client_id
        jobs[job.id] = job
        self._counts[_QUEUED_KEY] += 1
        seq = event.seq
        if seq >= self._next_seq:
            self._next_seq = seq + 1
        else:
            self._bump_seq(seq)
        not_before = job.not_before
        if not_before is None or not_before <= self._clock:
            if queue.push(job, client) and not queue.in_rotation:
                queue.in_rotation = True
                self._rotation.append(queue)
        else:
            self._place(job, queue)
        if job.expires_at is not None:
            self._job_expiry.push(job, self._counts[_QUEUED_KEY])

    def _on_assigned(self, event: Assigned) -> None:
        job = self._jobs.get(event.job_id)
        not_before = None if job is None else job.not_before
        delayed = not_before is not None and not_before > self._clock
        job = reducer.assigned(job, event)
        queue = self._queues[job.exec]
        if delayed:
            # Only a log from a faster clock gets here: the job is still in the delay heap.
            self._delays.remove(job)
            self._delayed -= 1
            queue.delayed -= 1
        else:
            queue.take(job)
        queue.running += 1
        counts = self._counts
        counts[_QUEUED_KEY] -= 1
        counts[_RUNNING_KEY] += 1
        worker = self._workers.get(event.worker_id) or self._worker_for(event.worker_id, event.at)
        worker.running[job.id] = job
        if worker.credit > 0:
            worker.credit -= 1
        self._clients[job.client_id].inflight += 1
        self._assign_seq += 1
        self._deadlines.push(event.deadline, job, counts[_RUNNING_KEY])

    def _on_reassigned(self, event: Reassigned) -> None:
        job = reducer.reassigned(self._jobs.get(event.job_id), event)
        previous = self._workers.get(event.previous_worker_id)
        worker = self._worker_for(event.worker_id, event.at)
        if worker is not previous:
            if previous is not None:
                previous.running.pop(job.id, None)
            worker.running[job.id] = job
        # A reassignment to the same worker spends a credit too: the timed-out attempt still
        # holds its slot until the worker gives it back (`Scheduler._expire`).
        if worker.credit > 0:
            worker.credit -= 1
        self._assign_seq += 1
        self._deadlines.push(event.deadline, job, self._counts[_RUNNING_KEY])

    def _on_job_heartbeat(self, event: JobHeartbeat) -> None:
        job = self._jobs.get(event.job_id)
        previous_deadline = None if job is None else job.deadline
        job = reducer.job_heartbeat(job, event)
        self._worker_for(event.worker_id, event.at).last_seen = event.at
        if event.deadline != previous_deadline:
            self._deadlines.push(event.deadline, job, self._counts[_RUNNING_KEY])

    def _on_completed(self, event: Completed) -> None:
        job = reducer.completed(self._jobs.get(event.job_id), event)
        self._stop_running(job, event.worker_id, event.at, alive=True)
        self._counts["succeeded"] += 1
        self._finished.append(job)

    def _on_requeued(self, event: Requeued) -> None:
        job = reducer.requeued(self._jobs.get(event.job_id), event)
        alive = event.reason is RequeueReason.FAILED
        self._stop_running(job, event.worker_id, event.at, alive)
        self._counts[_QUEUED_KEY] += 1
        self._bump_seq(event.seq)
        self._place(job, self._queues[job.exec])
        if job.expires_at is not None:
            # Its entry may have been popped while it ran: it may expire waiting to retry.
            self._job_expiry.push(job, self._counts[_QUEUED_KEY])

    def _on_dead_lettered(self, event: DeadLettered) -> None:
        job = reducer.dead_lettered(self._jobs.get(event.job_id), event)
        alive = event.reason in _WORKER_REPORTED_DEATHS
        self._stop_running(job, event.worker_id, event.at, alive)
        self._counts["dead"] += 1
        self._dead[job.id] = job

    def _on_cancel_requested(self, event: CancelRequested) -> None:
        job = self._jobs.get(event.job_id)
        previous_deadline = None if job is None else job.deadline
        job = reducer.cancel_requested(job, event)
        if event.deadline != previous_deadline:
            self._deadlines.push(event.deadline, job, self._counts[_RUNNING_KEY])

    def _on_cancelled(self, event: Cancelled) -> None:
        job = self._jobs.get(event.job_id)
        if event.worker_id is not None:
            job = reducer.cancelled(job, event)
            # Not counted as a sign of life, even when the worker confirmed: the event does
            # not say which (a passed grace, a lost worker), and a replay must agree.
            self._stop_running(job, event.worker_id, event.at, alive=False)
            self._finish(job)
            return
        self._end_queued(job, event, reducer.cancelled)

    def _on_expired(self, event: Expired) -> None:
        self._end_queued(self._jobs.get(event.job_id), event, reducer.expired)

    def _end_queued(
        self,
        job: JobRecord | None,
        event: Any,
        transition: Callable[[JobRecord | None, Any], JobRecord],
    ) -> None:
        """A queued job ended without running (cancelled, expired)."""
        delayed = job is not None and job.status is _QUEUED and self._is_delayed(job)
        job = transition(job, event)
        self._unqueue(job, delayed)
        self._finish(job)

    def _finish(self, job: JobRecord) -> None:
        self._counts[job.status.value] += 1
        self._finished.append(job)

    def _unqueue(self, job: JobRecord, delayed: bool) -> None:
        """Bookkeeping for a queued job that ended without running (cancelled, expired)."""
        queue = self._queues[job.exec]
        if delayed:
            # Its delay-heap entry is void now (the job is no longer queued).
            self._delayed -= 1
            queue.delayed -= 1
        else:
            queue.forget(job)
        self._counts[_QUEUED_KEY] -= 1

    def _on_redriven(self, event: Redriven) -> None:
        job = reducer.redriven(self._jobs.get(event.job_id), event)
        del self._dead[job.id]
        self._counts["dead"] -= 1
        self._counts[_QUEUED_KEY] += 1
        self._bump_seq(event.seq)
        self._place(job, self._queues[job.exec])

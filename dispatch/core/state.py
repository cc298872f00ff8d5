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

import math
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
    LimitRemoved,
    LimitSet,
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
from dispatch.core.limits import (
    ExecGate,
    KeyGate,
    KeyLimits,
    Limit,
    LimitScope,
    WakeHeap,
    new_bucket,
)
from dispatch.core.queues import ClientState, ExecQueue, Lane, unpark
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
        self._limits: dict[tuple[LimitScope, str], LimitSet] = {}
        """Runtime limits in force, by (scope, target), with the event that set each."""
        self._exec_gates: dict[str, ExecGate] = {}
        """Exec limits in force (runtime or settings), by pattern."""
        self._key_limits = KeyLimits()
        """Key limits in force (runtime or settings): which limit each key gets."""
        self._keys: dict[str, KeyGate] = {}
        """Keys with running or held jobs (or a bucket still refilling)."""
        self._wakes = WakeHeap()
        """Clients and gates out of rate tokens, by when they have one again."""
        self._rate_origin = -math.inf
        """A bucket that starts limiting is full, or as if emptied at this time if that is
        later: a restored state sets it to its clock (the starts before are unknown)."""
        for scope_name, targets in self.config.limits.items():
            for target, limit in targets.items():
                self._apply_limit(LimitScope(scope_name), target, limit, 0.0)
        self._handlers: dict[type[Event], Callable[[Any], None]] = {
            LeaderElected: self._on_leader_elected,
            Pruned: self._on_pruned,
            Paused: self._on_paused,
            Resumed: self._on_resumed,
            LimitSet: self._on_limit_set,
            LimitRemoved: self._on_limit_removed,
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
        """Move the clock forward; delayed jobs whose time has come become ready, and limits
        whose bucket has a token again serve what they held."""
        self._clock = now
        wakes = self._wakes.heap
        if wakes and wakes[0][0] <= now:
            for what in self._wakes.pop_due(now):
                self._wake_limit(what, now)
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
            if self._exec_gates:
                queue.gates = tuple(
                    gate
                    for gate in self._exec_gates.values()
                    if match_tokens(gate.pattern, queue.tokens)
                )
        return queue

    def _client(self, client_id: str) -> ClientState:
        client = self._clients.get(client_id)
        if client is None:
            client = self._clients[client_id] = ClientState(
                client_id, self.config.cap_for(client_id)
            )
            if self._pauses and (PauseScope.CLIENT, client_id) in self._pauses:
                client.pause(True)
            limit = self._limit_of(LimitScope.CLIENT, client_id)
            if limit is not None:
                self._limit_client(client, limit, self._clock)
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
        queue = self._queues[job.exec]
        queue.running -= 1
        self._counts[_RUNNING_KEY] -= 1
        client = self._clients[job.client_id]
        client.inflight -= 1
        if client.parked and client.inflight < client.room:
            self._unpark(client)
        if queue.gates:
            for gate in queue.gates:
                gate.inflight -= 1
                if gate.held:
                    self._release_exec(gate)
        if job.key is not None:
            key_gate = self._keys.get(job.key)
            if key_gate is not None:
                key_gate.inflight -= 1
                self._release_key(key_gate, at)

    # --- limits ---------------------------------------------------------------------------

    def _limit_of(self, scope: LimitScope, target: str) -> Limit | None:
        """The limit in force on (scope, target): the runtime one, else the settings'."""
        event = self._limits.get((scope, target))
        if event is not None:
            return event.limit
        return self.config.limits.get(scope.value, {}).get(target)

    def _limit_client(self, client: ClientState, limit: Limit | None, now: float) -> None:
        cap = None if limit is None else limit.max_inflight
        client.set_cap(self.config.cap_for(client.client_id) if cap is None else cap)
        if limit is None or limit.rate is None or limit.burst is None:
            client.bucket = None
        elif client.bucket is None:
            client.bucket = new_bucket(limit, now, self._rate_origin)
        else:
            client.bucket.retune(limit.rate, limit.burst, now)
        if client.parked:
            # Looser or not, the pass looks again (and parks them again if they wait).
            self._unpark(client)

    def _apply_limit(self, scope: LimitScope, target: str, limit: Limit | None, now: float) -> None:
        """Make `limit` (None: none) the one in force on (scope, target)."""
        origin = self._rate_origin
        if scope is LimitScope.CLIENT:
            client = self._clients.get(target)
            if client is not None:
                self._limit_client(client, limit, now)
            return
        if scope is LimitScope.EXEC:
            gate = self._exec_gates.get(target)
            if gate is None and limit is not None:
                gate = self._exec_gates[target] = ExecGate(target, limit, now, origin)
                for queue in self._queues.values():
                    if match_tokens(gate.pattern, queue.tokens):
                        queue.gates = (*queue.gates, gate)
                        gate.inflight += queue.running
            elif gate is not None and limit is None:
                del self._exec_gates[target]
                for queue in self._queues.values():
                    if gate in queue.gates:
                        queue.gates = tuple(other for other in queue.gates if other is not gate)
                self._release_exec(gate)
            elif gate is not None and limit is not None:
                gate.set_limit(limit, now, origin)
                self._release_exec(gate)
            return
        self._key_limits.set(target, limit)
        key_limits = self._key_limits
        for key_gate in list(self._keys.values()):
            wanted = key_limits.for_key(key_gate.key)
            if wanted is not key_gate.limit:
                key_gate.set_limit(wanted, now, origin)
                self._release_key(key_gate, now)

    def _release_exec(self, gate: ExecGate) -> None:
        """The exec limit may have room: the queues it stopped are servable again."""
        for exec_name in gate.held:
            queue = self._queues[exec_name]
            if queue.ready and not queue.in_rotation:
                queue.in_rotation = True
                self._rotation.append(queue)
        gate.held.clear()

    def _release_key(self, gate: KeyGate, now: float, group: tuple[str, str] | None = None) -> None:
        """The key may have room: as many held jobs as fit go back to their lanes (from each
        group of exec and client), then a key that holds nothing and is idle is forgotten."""
        if gate.held_jobs:
            room = gate.room(now)
            if room:
                for job in gate.release(room, group):
                    queue = self._queues[job.exec]
                    queue.limited -= 1
                    self._ready(job, queue)
        if not gate.held_jobs and gate.idle(now) and self._keys.get(gate.key) is gate:
            del self._keys[gate.key]

    def _key_gate(self, key: str, now: float) -> KeyGate:
        gate = self._keys.get(key)
        if gate is None:
            limit = self._key_limits.for_key(key) if self._key_limits else None
            gate = self._keys[key] = KeyGate(key, limit, now, self._rate_origin)
        return gate

    def _wake_limit(self, what: object, now: float) -> None:
        """A client or gate asked to be woken when its bucket has a token: it has."""
        if isinstance(what, ClientState):
            what.wake_at = None
            if what.parked and what.inflight < what.room:
                self._unpark(what)
        elif isinstance(what, ExecGate):
            what.wake_at = None
            self._release_exec(what)
        elif isinstance(what, KeyGate):
            what.wake_at = None
            self._release_key(what, now)

    def _ask_wake(self, what: ClientState | ExecGate | KeyGate, at: float) -> None:
        wake_at = what.wake_at
        if wake_at is None or at < wake_at:
            what.wake_at = at
            self._wakes.push(at, what)

    def client_blocked(self, client: ClientState, now: float) -> bool:
        """(Gatekeeper) The client's rate limit has no token now: it will be woken."""
        bucket = client.bucket
        if bucket is None or bucket.admits(now):
            return False
        self._ask_wake(client, bucket.ready_at(now))
        return True

    def key_admits(self, queue: ExecQueue, lane: Lane, job: JobRecord, now: float) -> bool:
        """(Gatekeeper) The job's key has room; else the key holds the job until it has."""
        gate = self._keys.get(job.key) if job.key is not None else None
        if gate is None:
            if not self._key_limits or job.key is None:
                return True
            gate = self._key_gate(job.key, now)
        if gate.admits(now):
            return True
        queue.hold(lane, job)
        gate.hold(job)
        bucket = gate.bucket
        if bucket is not None and not bucket.admits(now):
            self._ask_wake(gate, bucket.ready_at(now))
        return False

    def gates_admit(self, queue: ExecQueue, now: float) -> bool:
        """Every exec limit over the queue has room; else the first that has none holds the
        queue (out of the rotation) until it has."""
        for gate in queue.gates:
            if not gate.admits(now):
                gate.held.add(queue.exec)
                bucket = gate.bucket
                if bucket is not None and not bucket.admits(now):
                    self._ask_wake(gate, bucket.ready_at(now))
                return False
        return True

    def admits_again(self, job: JobRecord, queue: ExecQueue, now: float) -> bool:
        """Whether a running job's next attempt may start at once (a reassignment): every
        limit over it has room with the job itself counted out of the running."""
        client = self._clients[job.client_id]
        if client.inflight - 1 >= client.room:
            return False
        if client.bucket is not None and not client.bucket.admits(now):
            return False
        for gate in queue.gates:
            if not gate.admits(now, already_running=True):
                return False
        if job.key is not None:
            key_gate = self._keys.get(job.key)
            if key_gate is not None and not key_gate.admits(now, already_running=True):
                return False
        return True

    def restore_limits(self, limits: Iterable[LimitSet]) -> None:
        """After a snapshot was loaded: the runtime limits in force, counts rebuilt from the
        running jobs, and every bucket as if emptied at the snapshot's clock."""
        for event in limits:
            self._on_limit_set(event)
        now = self._clock
        self._rate_origin = now
        for client in self._clients.values():
            if client.bucket is not None:
                client.bucket.tokens = 0.0
                client.bucket.at = now
        for gate in self._exec_gates.values():
            gate.inflight = sum(
                queue.running for queue in self._queues.values() if gate in queue.gates
            )
            if gate.bucket is not None:
                gate.bucket.tokens = 0.0
                gate.bucket.at = now
        self._keys.clear()
        for job in self._jobs.values():
            if job.status is _RUNNING and job.key is not None:
                self._key_gate(job.key, now).inflight += 1

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
        # Keys kept only for a bucket still refilling are forgotten once it is full.
        idle = [gate for gate in self._keys.values() if not gate.held_jobs and gate.idle(event.at)]
        for gate in idle:
            del self._keys[gate.key]

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

    def _on_limit_set(self, event: LimitSet) -> None:
        key = (event.scope, event.target)
        self._limits.pop(key, None)
        # Re-inserted: the dict's order is the order the limits in force were set.
        self._limits[key] = event
        self._apply_limit(event.scope, event.target, event.limit, event.at)

    def _on_limit_removed(self, event: LimitRemoved) -> None:
        key = (event.scope, event.target)
        if self._limits.pop(key, None) is None:
            raise InvalidTransition(
                f"limit_removed {event.scope.value} {event.target!r}: no limit in force"
            )
        default = self.config.limits.get(event.scope.value, {}).get(event.target)
        self._apply_limit(event.scope, event.target, default, event.at)

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
        client = self._clients[job.client_id]
        client.inflight += 1
        if client.bucket is not None:
            client.bucket.take(event.at)
        if queue.gates:
            for gate in queue.gates:
                gate.inflight += 1
                gate.started(event.at)
        if job.key is not None:
            key_gate = self._keys.get(job.key) or self._key_gate(job.key, event.at)
            key_gate.inflight += 1
            key_gate.started(event.at)
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
        # A new attempt is a start: the rate limits over the job count it (the running
        # counts stay: the job was running already).
        bucket = self._clients[job.client_id].bucket
        if bucket is not None:
            bucket.take(event.at)
        for gate in self._queues[job.exec].gates:
            gate.started(event.at)
        if job.key is not None:
            self._key_gate(job.key, event.at).started(event.at)
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
        key_gate = None if job.key is None else self._keys.get(job.key)
        if delayed:
            # Its delay-heap entry is void now (the job is no longer queued).
            self._delayed -= 1
            queue.delayed -= 1
        elif key_gate is not None and key_gate.holds(job):
            key_gate.drop(job)
            queue.limited -= 1
        else:
            queue.forget(job)
            if key_gate is not None and key_gate.held_jobs:
                # It may have been released for a free slot of its key: another takes it.
                self._release_key(key_gate, job.updated_at, (job.exec, job.client_id))
        self._counts[_QUEUED_KEY] -= 1

    def _on_redriven(self, event: Redriven) -> None:
        job = reducer.redriven(self._jobs.get(event.job_id), event)
        del self._dead[job.id]
        self._counts["dead"] -= 1
        self._counts[_QUEUED_KEY] += 1
        self._bump_seq(event.seq)
        self._place(job, self._queues[job.exec])

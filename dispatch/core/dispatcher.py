"""The dispatcher: the pure state machine behind every behaviour of docs/spec.md §1-9.

`Dispatcher` is the whole public surface in one place: every command and query is listed
below with a one-line summary, and delegates to the part that does it (full docstring and
body there). The parts share one `DispatcherState` (the state and its fold, `apply`):

- `scheduler.Scheduler`: assignment passes, deadlines, silent and lost workers (`tick`,
  `dispatch`), and the helpers every command uses;
- `leader_commands.LeaderCommands`: `begin_epoch`, `resume`, `prune`;
- `client_commands.ClientCommands`: `submit`, `submit_many`, `cancel`, `cancel_where`,
  `redrive`;
- `worker_commands.WorkerCommands`: `join`, `grant_credit`, `worker_heartbeat`, `lose_worker`;
- `control_commands.ControlCommands`: `pause`, `unpause` (and the `pauses` query);
- `limit_commands.LimitCommands`: `set_limit`, `remove_limit` (and the views of limits);
- `settlement.SettlementCommands`: `ack`, `ack_many`, `fail`, `heartbeat`;
- `queries.DispatcherQueries`: read-only questions.

A command either returns the events it applied (possibly none, e.g. a duplicate submit) or
raises `Rejected` with a code, having changed nothing. After it has applied its own events,
a command runs an assignment pass (unless called with `dispatch=False`, for batching), so the
returned list may end with `assigned` events.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from dispatch.core.client_commands import MAX_CANCEL_BATCH, ClientCommands
from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.control_commands import ControlCommands
from dispatch.core.errors import Rejected
from dispatch.core.events import Event, LimitSet, Paused
from dispatch.core.fence import EpochFence
from dispatch.core.job import JobRecord, JobStatus
from dispatch.core.leader_commands import LeaderCommands
from dispatch.core.leases import LeaseTokens
from dispatch.core.limit_commands import LimitCommands
from dispatch.core.queries import ClientLoads, DispatcherQueries, QueueStats
from dispatch.core.restore import load_snapshot
from dispatch.core.scheduler import Scheduler
from dispatch.core.settlement import SettlementCommands
from dispatch.core.state import DispatcherState
from dispatch.core.worker_commands import MAX_CREDITS, WorkerCommands
from dispatch.core.workers import WorkerRecord

__all__ = ["MAX_CREDITS", "Dispatcher"]


class Dispatcher:
    """The pure dispatcher. Not thread-safe: one caller at a time."""

    def __init__(
        self,
        config: CoreConfig | None = None,
        *,
        epoch: int = 0,
        lease_token: LeaseTokens | None = None,
    ) -> None:
        """`lease_token` draws the random part of each new lease (`leases.RandomLeaseTokens`
        by default; pass `leases.seeded_lease_tokens(seed)` for reproducible events)."""
        state = DispatcherState(config, epoch=epoch, lease_token=lease_token)
        self.state = state
        """The state and its fold, shared by the parts below. For `checks` and tests; other
        callers use the commands and queries."""
        scheduler = Scheduler(state)
        self._scheduler = scheduler
        self._leader_commands = LeaderCommands(state, scheduler)
        self._client_commands = ClientCommands(state, scheduler)
        self._worker_commands = WorkerCommands(state, scheduler)
        self._settlement = SettlementCommands(state, scheduler)
        self._control = ControlCommands(state, scheduler)
        self._limits = LimitCommands(state, scheduler)
        self._queries = DispatcherQueries(state)

    @property
    def config(self) -> CoreConfig:
        """The configuration commands decide with (timeouts, caps, attempts)."""
        return self.state.config

    @property
    def fence(self) -> EpochFence:
        """The epoch fence `apply` admits logged events through."""
        return self.state.fence

    # --- folding logged events -------------------------------------------------------------

    def apply(self, event: Event) -> bool:
        """Fold one logged event; False when the epoch fence voids it."""
        return self.state.apply(event)

    def apply_all(self, events: Iterable[Event]) -> int:
        """Fold events in order; returns how many the fence admitted."""
        return self.state.apply_all(events)

    # --- leader ----------------------------------------------------------------------------

    def begin_epoch(self, epoch: int, now: float, *, holder: str = "") -> list[Event]:
        """Record that a leader with a newer `epoch` took over (`leader_elected`)."""
        return self._leader_commands.begin_epoch(epoch, now, holder=holder)

    def resume(self, now: float, *, outage_s: float = 0.0, reconnect_s: float = 0.0) -> list[Event]:
        """Call once after a rebuild, before serving: fresh expiry windows and deadlines."""
        return self._leader_commands.resume(now, outage_s=outage_s, reconnect_s=reconnect_s)

    def prune(self, before: float, now: float, keep_at_most: int | None = None) -> list[Event]:
        """Forget succeeded, cancelled and expired jobs that finished at or before `before`,
        and the oldest of them beyond `keep_at_most`."""
        return self._leader_commands.prune(before, now, keep_at_most)

    # --- time and assignment ---------------------------------------------------------------

    def tick(self, now: float) -> list[Event]:
        """Advance time: release delayed jobs, lose silent workers, handle deadlines, assign."""
        return self._scheduler.tick(now)

    def dispatch(self, now: float) -> list[Event]:
        """Run an assignment pass (after commands called with `dispatch=False`)."""
        return self._scheduler.dispatch(now)

    # --- clients ---------------------------------------------------------------------------

    def submit(self, request: SubmitRequest, now: float, *, dispatch: bool = True) -> list[Event]:
        """Enqueue a job (`enqueued`), unless its id is already known (then [])."""
        return self._client_commands.submit(request, now, dispatch=dispatch)

    def submit_many(
        self,
        requests: Iterable[SubmitRequest],
        now: float,
        *,
        refused: list[tuple[SubmitRequest, str]] | None = None,
    ) -> list[Event]:
        """Submit many jobs, then run one assignment pass; refusals go to `refused`."""
        return self._client_commands.submit_many(requests, now, refused=refused)

    def exec_queues_refusal(self, requests: Iterable[SubmitRequest]) -> str | None:
        """Why these submissions would create too many exec queues for a client, or None."""
        return self._client_commands.exec_queues_refusal(requests)

    def cancel(
        self, job_id: str, now: float, *, by: str | None = None, reason: str = ""
    ) -> list[Event]:
        """Cancel a queued job at once, or ask a running job's worker to stop (it ends
        `cancelled` when it confirms, or after the cancel grace). Finished jobs refuse."""
        return self._client_commands.cancel(job_id, now, by=by, reason=reason)

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
        """Cancel up to `limit` queued and/or running jobs matching a filter, oldest first."""
        return self._client_commands.cancel_where(
            now, exec_pattern=exec_pattern, client_id=client_id, statuses=statuses,
            limit=limit, by=by, reason=reason,
        )  # fmt: skip

    def redrive(self, job_id: str, now: float, *, by: str | None = None) -> list[Event]:
        """Requeue a dead-lettered job with its attempts reset to 0 (`by`: who asked)."""
        return self._client_commands.redrive(job_id, now, by=by)

    # --- operator controls -----------------------------------------------------------------

    def pause(
        self, scope: str, target: str, now: float, *, by: str | None = None, reason: str = ""
    ) -> list[Event]:
        """Start nothing new of an exec pattern (`scope="exec"`) or a client (`"client"`)."""
        return self._control.pause(scope, target, now, by=by, reason=reason)

    def unpause(self, scope: str, target: str, now: float, *, by: str | None = None) -> list[Event]:
        """End that pause (`resumed`), then assign what it held."""
        return self._control.unpause(scope, target, now, by=by)

    def pauses(self) -> list[Paused]:
        """The pauses in force (each its `paused` event), oldest first."""
        return self._control.pauses()

    def set_limit(
        self,
        scope: str,
        target: str,
        now: float,
        *,
        max_inflight: int | None = None,
        rate: float | None = None,
        burst: int | None = None,
        by: str | None = None,
        reason: str = "",
    ) -> list[Event]:
        """Put a runtime limit (`limit_set`) on a client, an exec pattern or a key
        (pattern): at most `max_inflight` running, at most `rate` starts a second."""
        return self._limits.set_limit(
            scope, target, now, max_inflight=max_inflight, rate=rate, burst=burst, by=by,
            reason=reason,
        )  # fmt: skip

    def remove_limit(
        self, scope: str, target: str, now: float, *, by: str | None = None
    ) -> list[Event]:
        """End a runtime limit (`limit_removed`; the settings' one applies again)."""
        return self._limits.remove_limit(scope, target, now, by=by)

    def limits(self) -> list[LimitSet]:
        """The runtime limits in force (each its `limit_set` event), oldest first."""
        return self._limits.limits()

    def limit_views(self) -> list[dict[str, Any]]:
        """Every limit in force (runtime and settings) with its counts, as plain data."""
        return self._limits.limit_views()

    def limit_view(self, scope: str, target: str) -> dict[str, Any] | None:
        """The limit in force on (scope, target) with its counts, or None."""
        return self._limits.limit_view(scope, target)

    # --- workers ---------------------------------------------------------------------------

    def join(
        self, worker_id: str, subjects: Sequence[str], now: float, *, owner: str | None = None
    ) -> list[Event]:
        """Register a worker, or update a known one's subject patterns."""
        return self._worker_commands.join(worker_id, subjects, now, owner=owner)

    def grant_credit(
        self, worker_id: str, credits: int, now: float, *, replace: bool = False
    ) -> list[Event]:
        """The worker can take `credits` more jobs; with `replace`, exactly `credits` jobs."""
        return self._worker_commands.grant_credit(worker_id, credits, now, replace=replace)

    def worker_heartbeat(self, worker_id: str, now: float) -> list[Event]:
        """The worker is alive (resets its expiry)."""
        return self._worker_commands.worker_heartbeat(worker_id, now)

    def lose_worker(
        self, worker_id: str, now: float, *, reason: str = "disconnected"
    ) -> list[Event]:
        """The worker is gone: requeue (or dead-letter) every job it holds, forget it."""
        return self._worker_commands.lose_worker(worker_id, now, reason=reason)

    # --- settlement ------------------------------------------------------------------------

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
        """The worker finished the job (`completed`, with its result)."""
        return self._settlement.ack(
            job_id, attempt, lease, now, result=result, worker_id=worker_id, owner=owner
        )

    def ack_many(
        self,
        acks: Iterable[tuple[str, int, str, Any]],
        now: float,
        *,
        worker_id: str | None = None,
        owner: str | None = None,
    ) -> tuple[list[Event], list[Rejected]]:
        """Settle many successes at once; returns (events, rejections)."""
        return self._settlement.ack_many(acks, now, worker_id=worker_id, owner=owner)

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
        """The attempt failed: requeue it after its retry delay (`retry_after_s`, else its
        policy's), or dead-letter it (permanent, or no attempt left)."""
        return self._settlement.fail(
            job_id,
            attempt,
            lease,
            now,
            error=error,
            retryable=retryable,
            worker_id=worker_id,
            owner=owner,
            retry_after_s=retry_after_s,
        )

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
        """The worker is still on the job: its deadline moves to now + the attempt's timeout
        (never past its time limit); `progress` becomes the job's latest report."""
        return self._settlement.heartbeat(
            job_id, attempt, lease, now, worker_id=worker_id, owner=owner, progress=progress
        )

    # --- queries ---------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current leader epoch: stamped on every event this core decides."""
        return self.state.fence.epoch

    @property
    def clock(self) -> float:
        """The latest time seen (commands' `now`, events' `at`)."""
        return self.state._clock

    def job(self, job_id: str) -> JobRecord | None:
        """A copy of the job's record, or None."""
        return self._queries.job(job_id)

    def job_view(self, job_id: str) -> JobRecord | None:
        """The live record, without copying: read it before the next command, never mutate it."""
        return self._queries.job_view(job_id)

    def jobs(self) -> Iterator[JobRecord]:
        """Every job held (live records: read-only), e.g. to write a snapshot."""
        return self._queries.jobs()

    def __len__(self) -> int:
        return len(self._queries)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._queries

    def worker(self, worker_id: str) -> WorkerRecord | None:
        return self._queries.worker(worker_id)

    def worker_owner(self, worker_id: str) -> str | None:
        """The name of the API key the live worker id is bound to, or None."""
        return self._queries.worker_owner(worker_id)

    def workers(self) -> list[WorkerRecord]:
        return self._queries.workers()

    def subject_patterns(self) -> frozenset[tuple[str, ...]]:
        return self._queries.subject_patterns()

    def dead_letters(self, limit: int | None = None) -> list[JobRecord]:
        """Copies of dead-lettered jobs, oldest first."""
        return self._queries.dead_letters(limit)

    def latest_dead_letters(self, limit: int) -> list[JobRecord]:
        """Copies of the `limit` most recently dead-lettered jobs, newest first."""
        return self._queries.latest_dead_letters(limit)

    def latest_finished(self, limit: int) -> list[JobRecord]:
        """Copies of the `limit` most recently succeeded or cancelled jobs, newest first."""
        return self._queries.latest_finished(limit)

    def queue_stats(self) -> list[QueueStats]:
        return self._queries.queue_stats()

    def counts(self) -> dict[str, int]:
        """Jobs held, by status."""
        return self._queries.counts()

    def inflight(self, client_id: str) -> int:
        """Jobs of the client running now."""
        return self._queries.inflight(client_id)

    def exec_paused(self, exec_name: str) -> bool:
        """Whether an exec pause in force holds jobs of `exec_name`."""
        return self._queries.exec_paused(exec_name)

    def client_paused(self, client_id: str) -> bool:
        """Whether a pause of the client is in force."""
        return self._queries.client_paused(client_id)

    def client_loads(self) -> ClientLoads:
        """Queued and running jobs per (client, exec), in O(lanes + delayed + running)."""
        return self._queries.client_loads()

    def next_timer_at(self) -> float | None:
        """The earliest time a `tick` could change something, or None."""
        return self._queries.next_timer_at()

    # --- rebuild ---------------------------------------------------------------------------

    @classmethod
    def restore(
        cls,
        jobs: Iterable[JobRecord],
        *,
        config: CoreConfig | None = None,
        workers: Iterable[WorkerRecord] = (),
        epoch: int = 0,
        owned: bool = False,
        pauses: Iterable[Paused] = (),
        limits: Iterable[LimitSet] = (),
    ) -> Dispatcher:
        """A dispatcher holding a snapshot: the job records (e.g. the Delta `jobs` table at
        some version), optionally the workers, and the fence epoch the snapshot was taken at.
        Then `apply` the log after the snapshot, and call `resume(now)` before serving.

        Running jobs keep their worker, lease and deadline, so an ack for an assignment the
        old leader made is accepted. A worker named by a running job but absent from
        `workers` becomes a placeholder (no subjects, no credit) until it joins again.
        The records are copied, unless `owned=True`: then the dispatcher takes the records
        themselves (no copy: see BENCHMARKS.md, *Rebuild*) and mutates them from then on,
        so pass only records nothing else refers to and do not use them afterwards (e.g. the
        list `dispatch.delta.snapshot.latest_snapshot` just read). ValueError names the first
        inconsistent record. `pauses` are the pauses in force at the snapshot (the `paused`
        events the streaming fold keeps); `limits` the runtime limits in force (its
        `limit_set` events). Every rate limit starts as if emptied at the snapshot's time.
        """
        dispatcher = cls(config, epoch=epoch)
        load_snapshot(dispatcher.state, jobs, workers, owned=owned)
        for paused in pauses:
            dispatcher.state._on_paused(paused)
        dispatcher.state.restore_limits(limits)
        return dispatcher

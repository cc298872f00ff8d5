"""Leader commands: taking over (`begin_epoch`), resuming after a rebuild, pruning."""

from __future__ import annotations

from dispatch.core import _validate as v
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import Event, JobHeartbeat, LeaderElected, Pruned, WorkerHeartbeat
from dispatch.core.scheduler import Scheduler
from dispatch.core.state import DispatcherState


class LeaderCommands:
    """What the leader itself decides about the group."""

    def __init__(self, state: DispatcherState, scheduler: Scheduler) -> None:
        self._state = state
        self._scheduler = scheduler

    def begin_epoch(self, epoch: int, now: float, *, holder: str = "") -> list[Event]:
        """Record that a leader with a newer `epoch` took over (`leader_elected`). Events
        decided from now on carry it; older epochs' events are void after it in the log."""
        state = self._state
        fence = state.fence
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch <= fence.epoch:
            raise Rejected(
                RejectCode.STALE_EPOCH, f"epoch {epoch!r} is not newer than {fence.epoch}"
            )
        now = state.advance_to(now)
        event = LeaderElected(epoch=epoch, at=now, holder=holder)
        fence.admit(event)
        out: list[Event] = []
        state.emit(event, out)
        return out

    def resume(self, now: float, *, outage_s: float = 0.0, reconnect_s: float = 0.0) -> list[Event]:
        """Call once after a rebuild, before serving: gives every known worker a fresh expiry
        window (a `worker_heartbeat` each), since the silence during the failover was not
        theirs; and moves every running job's deadline later by `outage_s`, and to at least
        now + `reconnect_s` (a `job_heartbeat` each, only where that changes it), for the same
        reason: for `outage_s` no leader served, and its worker could neither heartbeat nor
        ack, and then needs up to `reconnect_s` to find the new leader and resend. Without
        that, a job whose deadline passed during the failover was taken from its worker at
        the new leader's first tick, just before the worker resent its ack: it ran twice. A
        job stuck past its timeout still times out, that much later. Then an assignment
        pass."""
        state = self._state
        emit = state.emit
        now = state.advance_to(now)
        out: list[Event] = []
        epoch = state.fence.epoch
        floor = now + reconnect_s
        for worker_id, worker in list(state._workers.items()):
            emit(WorkerHeartbeat(epoch=epoch, at=now, worker_id=worker_id), out)
            if outage_s <= 0 and reconnect_s <= 0:
                continue
            for job in list(worker.running.values()):
                deadline = job.deadline
                if deadline is None or job.lease is None:
                    continue
                moved_to = max(deadline + outage_s, floor)
                if job.run_limit_at is not None:
                    # The hard limit moves for no outage, but a worker still gets its
                    # reconnect window to report an attempt that ended in time.
                    moved_to = min(moved_to, max(job.run_limit_at, floor))
                if deadline < now + max(outage_s, reconnect_s) and moved_to > deadline:
                    moved = JobHeartbeat(
                        epoch=epoch, at=now, job_id=job.id, worker_id=worker_id,
                        attempt=job.attempts, lease=job.lease, deadline=moved_to,
                    )  # fmt: skip
                    emit(moved, out)
        self._scheduler.assignment_pass(now, out)
        return out

    def prune(self, before: float, now: float, keep_at_most: int | None = None) -> list[Event]:
        """Forget succeeded, cancelled and expired jobs that finished at or before `before`
        (their ids can then be submitted again), and, with `keep_at_most`, the oldest
        finished jobs beyond that many. Dead jobs stay until redriven. Emits one `pruned`
        event if anything goes; it names the finish time at or before which jobs go, so the
        fold and a replay forget exactly these jobs."""
        try:
            before = v.as_number(before, "before")
            keep_at_most = v.as_opt_int(keep_at_most, "keep_at_most", 0)
        except ValueError as error:
            raise Rejected(RejectCode.INVALID, str(error)) from None
        state = self._state
        now = state.advance_to(now)
        finished = state._finished
        jobs = state._jobs
        while finished and jobs.get(finished[0].id) is not finished[0]:
            finished.popleft()
        if keep_at_most is not None and len(finished) > keep_at_most:
            # The deque is in finish order (event times never go back), so every job at or
            # before the cut goes. Entries of jobs no longer held count against the bound
            # (it may keep a few fewer): counting live ones would cost a walk of the deque.
            cut = finished[len(finished) - keep_at_most - 1].updated_at
            before = max(before, cut)
        if not finished or finished[0].updated_at > before:
            return []
        out: list[Event] = []
        state.emit(Pruned(epoch=state.fence.epoch, at=now, before=before), out)
        return out

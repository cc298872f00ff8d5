"""The dispatcher: the pure state machine behind every behaviour of docs/spec.md §1-9.

`Dispatcher` = state and fold (`state.DispatcherState`), queries (`queries`), the scheduler's
decisions (`scheduler`), worker commands (`worker_commands`), settlement (`settlement`), and
the client and leader commands below.

A command either returns the events it applied (possibly none, e.g. a duplicate submit) or
raises `Rejected` with a code, having changed nothing. After it has applied its own events,
a command runs an assignment pass (unless called with `dispatch=False`, for batching), so the
returned list may end with `assigned` events.
"""

from __future__ import annotations

from collections.abc import Iterable

from dispatch.core import _validate as v
from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import (
    Cancelled,
    Enqueued,
    Event,
    JobHeartbeat,
    LeaderElected,
    Pruned,
    Redriven,
    WorkerHeartbeat,
)
from dispatch.core.fast_events import new_enqueued
from dispatch.core.job import JobRecord, JobStatus
from dispatch.core.queues import MAX_EXEC_QUEUES_PER_CLIENT
from dispatch.core.restore import load_snapshot
from dispatch.core.settlement import SettlementCommands
from dispatch.core.worker_commands import MAX_CREDITS, WorkerCommands
from dispatch.core.workers import WorkerRecord

__all__ = ["MAX_CREDITS", "Dispatcher"]


class Dispatcher(WorkerCommands, SettlementCommands):
    """The pure dispatcher. Not thread-safe: one caller at a time."""

    # --- leader ----------------------------------------------------------------------------

    def begin_epoch(self, epoch: int, now: float, *, holder: str = "") -> list[Event]:
        """Record that a leader with a newer `epoch` took over (`leader_elected`). Events
        decided from now on carry it; older epochs' events are void after it in the log."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch <= self.fence.epoch:
            raise Rejected(
                RejectCode.STALE_EPOCH, f"epoch {epoch!r} is not newer than {self.fence.epoch}"
            )
        now = self._now(now)
        event = LeaderElected(epoch=epoch, at=now, holder=holder)
        self.fence.admit(event)
        out: list[Event] = []
        self._emit(event, out)
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
        now = self._now(now)
        out: list[Event] = []
        epoch = self.fence.epoch
        floor = now + reconnect_s
        for worker_id, worker in list(self._workers.items()):
            self._emit(WorkerHeartbeat(epoch=epoch, at=now, worker_id=worker_id), out)
            if outage_s <= 0 and reconnect_s <= 0:
                continue
            for job in list(worker.running.values()):
                deadline = job.deadline
                if deadline is None or job.lease is None:
                    continue
                moved_to = max(deadline + outage_s, floor)
                if deadline < now + max(outage_s, reconnect_s) and moved_to > deadline:
                    moved = JobHeartbeat(
                        epoch=epoch, at=now, job_id=job.id, worker_id=worker_id,
                        attempt=job.attempts, lease=job.lease, deadline=moved_to,
                    )  # fmt: skip
                    self._emit(moved, out)
        self._dispatch(now, out)
        return out

    def prune(self, before: float, now: float) -> list[Event]:
        """Forget succeeded and cancelled jobs that finished at or before `before` (their ids
        can then be submitted again). Dead jobs stay until redriven. Emits one `pruned` event
        if anything goes."""
        try:
            before = v.as_number(before, "before")
        except ValueError as error:
            raise Rejected(RejectCode.INVALID, str(error)) from None
        now = self._now(now)
        finished = self._finished
        while finished and self._jobs.get(finished[0].id) is not finished[0]:
            finished.popleft()
        if not finished or finished[0].updated_at > before:
            return []
        out: list[Event] = []
        self._emit(Pruned(epoch=self.fence.epoch, at=now, before=before), out)
        return out

    # --- clients ---------------------------------------------------------------------------

    def submit(self, request: SubmitRequest, now: float, *, dispatch: bool = True) -> list[Event]:
        """Enqueue a job (`enqueued`), unless its id is already known: then nothing happens
        and [] is returned (read the existing job with `job(id)`). Rejected INVALID when it
        would create one exec queue more than its client may (MAX_EXEC_QUEUES_PER_CLIENT)."""
        if request.id not in self._jobs:
            refusal = self._exec_refusal(request)
            if refusal is not None:
                raise Rejected(RejectCode.INVALID, refusal, job_id=request.id)
        now = float(now)
        if now > self._clock:
            self._advance(now)
        now = self._clock
        out: list[Event] = []
        if request.id not in self._jobs:
            self._enqueue(request, now, out)
            if dispatch and self._rotation:
                self._dispatch(now, out)
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
        now = self._now(now)
        out: list[Event] = []
        jobs = self._jobs
        for request in requests:
            if request.id in jobs:
                continue
            refusal = self._exec_refusal(request)
            if refusal is not None:
                if refused is not None:
                    refused.append((request, refusal))
                continue
            self._enqueue(request, now, out)
        self._dispatch(now, out)
        return out

    def exec_queues_refusal(self, requests: Iterable[SubmitRequest]) -> str | None:
        """Why these submissions, together, would create more exec queues than one of their
        clients may have, or None. For a submitter's early answer (the REST path asks before
        writing to Kafka, so a client learns it at once, not from a rejection record); the
        leader's `submit_many` decides for good."""
        new_by_client: dict[str, set[str]] = {}
        for request in requests:
            if request.exec not in self._queues:
                new_by_client.setdefault(request.client_id, set()).add(request.exec)
        for client_id, execs in new_by_client.items():
            client = self._clients.get(client_id)
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
        if request.exec in self._queues:
            return None
        client = self._clients.get(request.client_id)
        if client is None or client.exec_queues < MAX_EXEC_QUEUES_PER_CLIENT:
            return None
        return (
            f"exec {request.exec!r}: client {request.client_id!r} already created "
            f"{client.exec_queues} exec queues, the most one client may "
            f"({MAX_EXEC_QUEUES_PER_CLIENT}); use an existing exec name"
        )

    def _on_enqueued(self, event: Enqueued) -> None:
        # Also the fold of logged `enqueued` events (`apply` dispatches here): a replayed
        # log counts each client's queues like the leader that wrote it.
        created = event.exec not in self._queues
        super()._on_enqueued(event)
        if created:
            self._clients[event.client_id].exec_queues += 1

    def _enqueue(self, request: SubmitRequest, now: float, out: list[Event]) -> None:
        config = self.config
        not_before = request.not_before
        if request.delay_s:
            not_before = now + request.delay_s
        elif not_before is not None and not_before <= now:
            not_before = None
        event = new_enqueued(
            self.fence.epoch,
            now,
            request.id,
            request.client_id,
            request.exec,
            request.payload,
            request.max_attempts or config.max_attempts,
            request.timeout_s or config.ack_timeout_s,
            request.priority,
            not_before,
            self._next_seq,
        )
        self._on_enqueued(event)
        out.append(event)

    def cancel(self, job_id: str, now: float) -> list[Event]:
        """Cancel a queued (ready or delayed) job. Running and finished jobs refuse."""
        job = self._job(job_id)
        if job.status is not JobStatus.QUEUED:
            raise Rejected(
                RejectCode.NOT_CANCELLABLE,
                f"job {job_id!r} is {job.status.value}; only queued jobs can be cancelled",
                job_id=job_id,
            )
        now = self._now(now)
        out: list[Event] = []
        self._emit(Cancelled(epoch=self.fence.epoch, at=now, job_id=job_id), out)
        return out

    def redrive(self, job_id: str, now: float) -> list[Event]:
        """Requeue a dead-lettered job with its attempts reset to 0."""
        job = self._job(job_id)
        if job.status is not JobStatus.DEAD:
            raise Rejected(
                RejectCode.NOT_DEAD,
                f"job {job_id!r} is {job.status.value}; only dead jobs can be redriven",
                job_id=job_id,
            )
        now = self._now(now)
        out: list[Event] = []
        self._emit(Redriven(epoch=self.fence.epoch, at=now, job_id=job_id, seq=self._next_seq), out)
        self._dispatch(now, out)
        return out

    # --- dashboard queries -----------------------------------------------------------------

    def latest_dead_letters(self, limit: int) -> list[JobRecord]:
        """Copies of the `limit` most recently dead-lettered jobs, newest first: the tail of
        the DLQ without copying all of it (`dead_letters()` copies every dead job)."""
        out: list[JobRecord] = []
        for job in reversed(self._dead.values()):
            if len(out) >= limit:
                break
            out.append(job.copy())
        return out

    def latest_finished(self, limit: int) -> list[JobRecord]:
        """Copies of the `limit` most recently succeeded or cancelled jobs still held, newest
        first. Costs O(limit), not O(jobs held): the leader keeps finished jobs for a day."""
        out: list[JobRecord] = []
        jobs = self._jobs
        for job in reversed(self._finished):
            if len(out) >= limit:
                break
            # An entry whose id was pruned (and maybe submitted again) is no longer the job.
            if jobs.get(job.id) is job:
                out.append(job.copy())
        return out

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
        list `streaming.snapshot.latest_snapshot` just read). ValueError names the first
        inconsistent record.
        """
        dispatcher = cls(config, epoch=epoch)
        load_snapshot(dispatcher, jobs, workers, owned=owned)
        return dispatcher

"""Read-only questions about the state (for the API, metrics and tests): the `Dispatcher`'s
queries, over the state it is given."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dispatch.core.events import PauseScope
from dispatch.core.job import JobRecord, JobStatus
from dispatch.core.state import DispatcherState
from dispatch.core.workers import WorkerRecord


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts of one exec queue (`GET /v1/queues`)."""

    exec: str
    ready: int
    """Queued and runnable now (including clients waiting at their cap)."""
    delayed: int
    """Queued with a `not_before` in the future."""
    running: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "exec": self.exec,
            "ready": self.ready,
            "delayed": self.delayed,
            "running": self.running,
        }


@dataclass(slots=True)
class ClientLoad:
    """Live jobs of one client (of one exec, or summed over its execs)."""

    queued: int = 0
    """Queued: ready (including those waiting at the client's cap) and delayed."""
    running: int = 0

    def add(self, other: ClientLoad) -> None:
        self.queued += other.queued
        self.running += other.running


@dataclass(frozen=True, slots=True)
class ClientLoads:
    """`DispatcherQueries.client_loads`: per (client_id, exec), and what the walk cost."""

    by_client_exec: dict[tuple[str, str], ClientLoad]
    visited: int
    """Lanes, delayed and running jobs visited: a caller that runs it often can back off."""

    def per_client(self) -> dict[str, ClientLoad]:
        """The loads summed over each client's execs."""
        totals: dict[str, ClientLoad] = {}
        for (client_id, _exec), one in self.by_client_exec.items():
            total = totals.get(client_id)
            if total is None:
                total = totals[client_id] = ClientLoad()
            total.add(one)
        return totals


class DispatcherQueries:
    """Queries of the state. Records returned by `job()` and `dead_letters()` are copies;
    `job_view()` and `jobs()` hand out live records to read, never to mutate."""

    def __init__(self, state: DispatcherState) -> None:
        self._state = state

    def job(self, job_id: str) -> JobRecord | None:
        """A copy of the job's record, or None."""
        job = self._state._jobs.get(job_id)
        return None if job is None else job.copy()

    def job_view(self, job_id: str) -> JobRecord | None:
        """The live record, without copying: read it before the next command, never mutate it."""
        return self._state._jobs.get(job_id)

    def jobs(self) -> Iterator[JobRecord]:
        """Every job held (live records: read-only), e.g. to write a snapshot."""
        return iter(self._state._jobs.values())

    def __len__(self) -> int:
        return len(self._state._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._state._jobs

    def worker(self, worker_id: str) -> WorkerRecord | None:
        worker = self._state._workers.get(worker_id)
        return None if worker is None else worker.record()

    def worker_owner(self, worker_id: str) -> str | None:
        """The name of the API key the live worker id is bound to; None when the worker is
        unknown or its owner is (an admin's join, a placeholder after a restore)."""
        worker = self._state._workers.get(worker_id)
        return None if worker is None else worker.owner

    def workers(self) -> list[WorkerRecord]:
        return [worker.record() for worker in self._state._workers.values()]

    def subject_patterns(self) -> frozenset[tuple[str, ...]]:
        """The distinct compiled subject patterns of the workers joined now (what the
        submit answer checks an exec against). O(workers * patterns), no copies."""
        return frozenset(
            pattern for worker in self._state._workers.values() for pattern in worker.patterns
        )

    def dead_letters(self, limit: int | None = None) -> list[JobRecord]:
        """Copies of dead-lettered jobs, oldest first."""
        out: list[JobRecord] = []
        for job in self._state._dead.values():
            if limit is not None and len(out) >= limit:
                break
            out.append(job.copy())
        return out

    def latest_dead_letters(self, limit: int) -> list[JobRecord]:
        """Copies of the `limit` most recently dead-lettered jobs, newest first: the tail of
        the DLQ without copying all of it (`dead_letters()` copies every dead job)."""
        out: list[JobRecord] = []
        for job in reversed(self._state._dead.values()):
            if len(out) >= limit:
                break
            out.append(job.copy())
        return out

    def latest_finished(self, limit: int) -> list[JobRecord]:
        """Copies of the `limit` most recently succeeded or cancelled jobs still held, newest
        first. Costs O(limit), not O(jobs held): the leader keeps finished jobs for a day."""
        out: list[JobRecord] = []
        jobs = self._state._jobs
        for job in reversed(self._state._finished):
            if len(out) >= limit:
                break
            # An entry whose id was pruned (and maybe submitted again) is no longer the job.
            if jobs.get(job.id) is job:
                out.append(job.copy())
        return out

    def queue_stats(self) -> list[QueueStats]:
        return [
            QueueStats(queue.exec, queue.ready, queue.delayed, queue.running)
            for queue in sorted(self._state._queues.values(), key=lambda queue: queue.exec)
        ]

    def counts(self) -> dict[str, int]:
        """Jobs held, by status."""
        return dict(self._state._counts)

    def inflight(self, client_id: str) -> int:
        """Jobs of the client running now."""
        client = self._state._clients.get(client_id)
        return 0 if client is None else client.inflight

    def exec_paused(self, exec_name: str) -> bool:
        """Whether an exec pause in force holds jobs of `exec_name` (O(exec pauses))."""
        state = self._state
        return bool(state._paused_execs) and state._exec_paused(tuple(exec_name.split(".")))

    def client_paused(self, client_id: str) -> bool:
        """Whether a pause of the client is in force."""
        return (PauseScope.CLIENT, client_id) in self._state._pauses

    def client_loads(self) -> ClientLoads:
        """Queued and running jobs per (client, exec); pairs with neither are left out.

        Costs O(lanes + delayed jobs + running jobs), never O(jobs held): the leader holds the
        finished jobs of the dedup window too (a walk over a million took 0.75 s, a stall of
        every request). Each queued job sits in exactly one place: one client's lane of an
        exec queue, or the delay heap."""
        state = self._state
        loads: dict[tuple[str, str], ClientLoad] = {}
        visited = 0

        def load(client_id: str, exec_name: str) -> ClientLoad:
            found = loads.get((client_id, exec_name))
            if found is None:
                found = loads[(client_id, exec_name)] = ClientLoad()
            return found

        for queue in state._queues.values():
            for lane in queue.lanes():
                visited += 1
                load(lane.client.client_id, queue.exec).queued += lane.live
        jobs = state._jobs
        seen: set[str] = set()
        for job in state._delays.jobs():
            visited += 1
            # A stale entry (a job replaced by a later life of its id) is skipped, as the
            # invariant checks skip it.
            if jobs.get(job.id) is job and job.id not in seen:
                seen.add(job.id)
                load(job.client_id, job.exec).queued += 1
        for worker in state._workers.values():
            for job_id in worker.running:
                visited += 1
                running = jobs.get(job_id)
                if running is not None and running.status is JobStatus.RUNNING:
                    load(running.client_id, running.exec).running += 1
        return ClientLoads(loads, visited)

    def next_timer_at(self) -> float | None:
        """The earliest time a `tick` could change something (a deadline, a delayed job, a
        worker expiry, a rate limit's next token), so the leader may sleep until then. Stale
        entries can make it early, never late."""
        state = self._state
        times = [
            heap[0][0]
            for heap in (
                state._deadlines.heap,
                state._delays.heap,
                state._expiry.heap,
                state._job_expiry.heap,
                state._wakes.heap,
            )
            if heap
        ]
        return min(times) if times else None

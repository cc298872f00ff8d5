"""Min-heaps with lazy deletion for everything that happens at a time: ack deadlines, delayed
jobs becoming ready, workers going silent. A tick only looks at the heap fronts, so its cost
does not grow with the number of queued or running jobs.

Entries are never removed when they become void (a job acked before its deadline, a delayed
job cancelled): each pop re-checks the entry against the live record, and a heap that holds
more than twice its live entries is rebuilt (amortised O(1) per push).
"""

from __future__ import annotations

import heapq
from itertools import count

from dispatch.core.job import JobRecord, JobStatus
from dispatch.core.workers import WorkerState

_RUNNING = JobStatus.RUNNING
_QUEUED = JobStatus.QUEUED
_COMPACT_SLACK = 1024


class DeadlineHeap:
    """Running jobs by ack deadline. An entry is live while the job still runs with exactly
    that deadline (an ack, requeue, reassignment or heartbeat voids it)."""

    __slots__ = ("_counter", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, JobRecord]] = []
        # Tie-breaker so two equal deadlines never compare job records.
        self._counter = count()

    def push(self, deadline: float, job: JobRecord, live_count: int) -> None:
        heap = self.heap
        heapq.heappush(heap, (deadline, next(self._counter), job))
        if len(heap) > 2 * live_count + _COMPACT_SLACK:
            self.heap = [
                entry
                for entry in heap
                if entry[2].status is _RUNNING and entry[2].deadline == entry[0]
            ]
            heapq.heapify(self.heap)

    def pop_expired(self, now: float) -> list[JobRecord]:
        """Running jobs whose deadline is at or before `now`, earliest first."""
        heap = self.heap
        expired: list[JobRecord] = []
        while heap and heap[0][0] <= now:
            deadline, _, job = heapq.heappop(heap)
            if job.status is _RUNNING and job.deadline == deadline:
                expired.append(job)
        return expired

    def next_at(self) -> float | None:
        return self.heap[0][0] if self.heap else None


class DelayHeap:
    """Delayed queued jobs by `not_before`."""

    __slots__ = ("heap",)

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, JobRecord]] = []

    def push(self, job: JobRecord, live_count: int) -> None:
        assert job.not_before is not None
        heap = self.heap
        heapq.heappush(heap, (job.not_before, job.seq, job))
        if len(heap) > 2 * live_count + _COMPACT_SLACK:
            self.heap = [entry for entry in heap if entry[2].status is _QUEUED]
            heapq.heapify(self.heap)

    def pop_due(self, clock: float) -> list[JobRecord]:
        """Still-queued jobs whose `not_before` is at or before `clock`, in (time, seq) order."""
        heap = self.heap
        due: list[JobRecord] = []
        while heap and heap[0][0] <= clock:
            job = heapq.heappop(heap)[2]
            if job.status is _QUEUED:
                due.append(job)
        return due

    def remove(self, job: JobRecord) -> None:
        """Drop one job's entry at once (rare: only for logs that disagree with this state)."""
        self.heap = [entry for entry in self.heap if entry[2] is not job]
        heapq.heapify(self.heap)

    def jobs(self) -> list[JobRecord]:
        return [entry[2] for entry in self.heap if entry[2].status is _QUEUED]


class JobExpiryHeap:
    """Queued jobs by `expires_at`. An entry is live while the job is still queued with that
    expiry (an assignment, cancel or redrive voids it; a requeue pushes a new one)."""

    __slots__ = ("_counter", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, JobRecord]] = []
        self._counter = count()

    def push(self, job: JobRecord, live_count: int) -> None:
        assert job.expires_at is not None
        heap = self.heap
        heapq.heappush(heap, (job.expires_at, next(self._counter), job))
        if len(heap) > 2 * live_count + _COMPACT_SLACK:
            self.heap = [entry for entry in heap if _expirable(entry)]
            heapq.heapify(self.heap)

    def pop_due(self, now: float) -> list[JobRecord]:
        """Queued jobs whose `expires_at` is at or before `now`, earliest first (each once)."""
        heap = self.heap
        due: list[JobRecord] = []
        seen: set[str] = set()
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            job = entry[2]
            if _expirable(entry) and job.id not in seen:
                seen.add(job.id)
                due.append(job)
        return due

    def next_at(self) -> float | None:
        return self.heap[0][0] if self.heap else None


def _expirable(entry: tuple[float, int, JobRecord]) -> bool:
    job = entry[2]
    return job.status is _QUEUED and job.expires_at == entry[0]


class ExpiryHeap:
    """Workers by the time they would be lost if they stay silent. One entry per worker
    object: when popped, an entry is re-pushed at the worker's real expiry if it was seen
    since, and dropped if the worker is gone."""

    __slots__ = ("_counter", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, WorkerState]] = []
        self._counter = count()

    def push(self, expires_at: float, worker: WorkerState) -> None:
        heapq.heappush(self.heap, (expires_at, next(self._counter), worker))

    def pop_silent(
        self, now: float, expiry_s: float, current: dict[str, WorkerState]
    ) -> list[WorkerState]:
        """Workers silent for `expiry_s` or longer at `now`, oldest first."""
        heap = self.heap
        silent: list[WorkerState] = []
        while heap and heap[0][0] <= now:
            _, _, worker = heapq.heappop(heap)
            if current.get(worker.worker_id) is not worker:
                continue
            expires_at = worker.last_seen + expiry_s
            if expires_at <= now:
                silent.append(worker)
            else:
                self.push(expires_at, worker)
        return silent

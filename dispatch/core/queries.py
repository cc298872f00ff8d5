"""Read-only questions about the state (for the API, metrics and tests)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dispatch.core.job import JobRecord
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


class DispatcherQueries(DispatcherState):
    """The state plus its queries. Records returned by `job()` and `dead_letters()` are
    copies; `job_view()` and `jobs()` hand out live records to read, never to mutate."""

    @property
    def epoch(self) -> int:
        """The current leader epoch: stamped on every event this core decides."""
        return self.fence.epoch

    @property
    def clock(self) -> float:
        """The latest time seen (commands' `now`, events' `at`)."""
        return self._clock

    def job(self, job_id: str) -> JobRecord | None:
        """A copy of the job's record, or None."""
        job = self._jobs.get(job_id)
        return None if job is None else job.copy()

    def job_view(self, job_id: str) -> JobRecord | None:
        """The live record, without copying: read it before the next command, never mutate it."""
        return self._jobs.get(job_id)

    def jobs(self) -> Iterator[JobRecord]:
        """Every job held (live records: read-only), e.g. to write a snapshot."""
        return iter(self._jobs.values())

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def worker(self, worker_id: str) -> WorkerRecord | None:
        worker = self._workers.get(worker_id)
        return None if worker is None else worker.record()

    def worker_owner(self, worker_id: str) -> str | None:
        """The name of the API key the live worker id is bound to; None when the worker is
        unknown or its owner is (an admin's join, a placeholder after a restore)."""
        worker = self._workers.get(worker_id)
        return None if worker is None else worker.owner

    def workers(self) -> list[WorkerRecord]:
        return [worker.record() for worker in self._workers.values()]

    def dead_letters(self, limit: int | None = None) -> list[JobRecord]:
        """Copies of dead-lettered jobs, oldest first."""
        out: list[JobRecord] = []
        for job in self._dead.values():
            if limit is not None and len(out) >= limit:
                break
            out.append(job.copy())
        return out

    def queue_stats(self) -> list[QueueStats]:
        return [
            QueueStats(queue.exec, queue.ready, queue.delayed, queue.running)
            for queue in sorted(self._queues.values(), key=lambda queue: queue.exec)
        ]

    def counts(self) -> dict[str, int]:
        """Jobs held, by status."""
        return dict(self._counts)

    def inflight(self, client_id: str) -> int:
        """Jobs of the client running now."""
        client = self._clients.get(client_id)
        return 0 if client is None else client.inflight

    def next_timer_at(self) -> float | None:
        """The earliest time a `tick` could change something (a deadline, a delayed job, a
        worker expiry), so the leader may sleep until then. Stale entries can make it early,
        never late."""
        times = [
            heap[0][0]
            for heap in (self._deadlines.heap, self._delays.heap, self._expiry.heap)
            if heap
        ]
        return min(times) if times else None

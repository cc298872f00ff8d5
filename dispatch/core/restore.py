"""Loading a snapshot (job records, optionally workers) into an empty dispatcher state."""

from __future__ import annotations

from collections.abc import Iterable

from dispatch.core.job import JobRecord, JobStatus, check_record
from dispatch.core.state import DispatcherState
from dispatch.core.workers import WorkerRecord


def load_snapshot(
    state: DispatcherState, jobs: Iterable[JobRecord], workers: Iterable[WorkerRecord] = ()
) -> None:
    """Fill an empty `state` with copies of the records; indexes are rebuilt from them.

    The clock starts at the latest `updated_at` / `last_seen` in the snapshot. Queue order
    comes from each job's `seq`, so it is exactly the order the old leader had.
    """
    if state._jobs or state._workers:
        raise ValueError("restore: the dispatcher must be empty")
    records: list[JobRecord] = []
    seen: set[str] = set()
    for original in jobs:
        if not isinstance(original, JobRecord):
            raise ValueError(f"restore: expected JobRecord, got {type(original).__name__}")
        if original.id in seen:
            raise ValueError(f"restore: job {original.id!r} appears twice")
        seen.add(original.id)
        job = original.copy()
        check_record(job)
        records.append(job)
    worker_records = list(workers)

    clock = max(
        [job.updated_at for job in records] + [worker.last_seen for worker in worker_records],
        default=0.0,
    )
    state._clock = clock
    for record in worker_records:
        if record.worker_id in state._workers:
            raise ValueError(f"restore: worker {record.worker_id!r} appears twice")
        worker = state._add_worker(record.worker_id, record.subjects, record.last_seen)
        worker.credit = record.credit

    # Queue order, assignment order and finishing order, as the old leader had them.
    records.sort(key=lambda job: (job.updated_at, job.seq))
    counts = state._counts
    for job in sorted(records, key=lambda job: job.seq):
        queue = state._queue(job.exec)
        job.exec = queue.exec
        job.client_id = state._client(job.client_id).client_id
        state._jobs[job.id] = job
        counts[job.status.value] += 1
        state._bump_seq(job.seq)
        if job.status is JobStatus.QUEUED:
            state._place(job, queue)
    for job in records:
        status = job.status
        if status is JobStatus.RUNNING:
            worker = state._worker_for(job.worker_id or "", clock)
            worker.running[job.id] = job
            state._queues[job.exec].running += 1
            state._clients[job.client_id].inflight += 1
            assert job.deadline is not None
            state._deadlines.push(job.deadline, job, counts["running"])
        elif status is JobStatus.DEAD:
            state._dead[job.id] = job
        elif status is not JobStatus.QUEUED:
            state._finished.append(job)

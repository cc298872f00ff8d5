"""Timer heaps: lazy deletion, compaction, and silent-worker detection."""

from __future__ import annotations

from dispatch.core import JobRecord, JobStatus
from dispatch.core.timers import DeadlineHeap, DelayHeap, ExpiryHeap
from dispatch.core.workers import WorkerState


def running(job_id: str, deadline: float) -> JobRecord:
    return JobRecord(
        id=job_id,
        client_id="c",
        exec="x",
        payload=None,
        max_attempts=3,
        timeout_s=1.0,
        submitted_at=0.0,
        updated_at=0.0,
        seq=1,
        status=JobStatus.RUNNING,
        attempts=1,
        worker_id="w",
        lease="0.1",
        deadline=deadline,
    )


def test_only_live_deadlines_expire_in_order() -> None:
    heap = DeadlineHeap()
    late, early, acked, moved = (
        running("late", 9),
        running("early", 3),
        running("acked", 4),
        running("moved", 5),
    )
    for job in (late, early, acked, moved):
        heap.push(job.deadline or 0.0, job, 4)
    acked.status = JobStatus.SUCCEEDED
    moved.deadline = 20.0
    heap.push(20.0, moved, 4)
    assert heap.pop_expired(2.0) == []
    assert [job.id for job in heap.pop_expired(10.0)] == ["early", "late"]
    assert heap.next_at() == 20.0


def test_a_heap_of_mostly_void_entries_is_compacted() -> None:
    heap = DeadlineHeap()
    for n in range(5_000):
        job = running(f"j{n}", float(n))
        heap.push(float(n), job, live_count=1)
        job.status = JobStatus.SUCCEEDED
    assert len(heap.heap) <= 2 + 1024 + 1


def test_delayed_jobs_come_out_when_due_unless_cancelled() -> None:
    heap = DelayHeap()
    jobs = []
    for n, when in enumerate((5.0, 3.0, 4.0)):
        job = running(f"d{n}", 0.0)
        job.status, job.deadline, job.not_before, job.seq = JobStatus.QUEUED, None, when, n
        heap.push(job, 3)
        jobs.append(job)
    jobs[2].status = JobStatus.CANCELLED
    assert [job.id for job in heap.pop_due(4.5)] == ["d1"]
    assert [job.id for job in heap.jobs()] == ["d0"]


def test_silent_workers_are_found_and_live_ones_rescheduled() -> None:
    heap = ExpiryHeap()
    quiet, chatty, gone = (WorkerState(name, ("a",), 0.0) for name in ("quiet", "chatty", "gone"))
    current = {"quiet": quiet, "chatty": chatty}
    for worker in (quiet, chatty, gone):
        heap.push(10.0, worker)
    chatty.last_seen = 8.0
    assert heap.pop_silent(10.0, 10.0, current) == [quiet]
    assert [entry[0] for entry in heap.heap] == [18.0], "chatty is due again at 18"

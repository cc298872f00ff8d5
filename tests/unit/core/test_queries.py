"""Read-only queries: the DLQ listing, queue stats, counts, copies of records."""

from __future__ import annotations

from dispatch.core import (
    JobStatus,
    SubmitRequest,
)
from tests.unit.core.helpers import (
    T0,
    assignments,
    make,
    request,
    worker,
)


def test_dead_letter_queue_lists_dead_jobs_oldest_first() -> None:
    d = make(max_attempts=1)
    worker(d, "w", credits=3)
    events = d.submit_many([request("a"), request("b"), request("c")], T0)
    by_id = {e.job_id: e for e in assignments(events)}
    d.fail("c", 1, by_id["c"].lease, T0 + 1, error="x")
    d.fail("a", 1, by_id["a"].lease, T0 + 2, error="y")
    assert [job.id for job in d.dead_letters()] == ["c", "a"]
    assert [job.id for job in d.dead_letters(limit=1)] == ["c"]


def test_queries_report_queues_workers_and_counts() -> None:
    d = make()
    worker(d, "w", credits=1)
    d.submit_many([request("a"), request("b"), request("later", delay_s=9.0)], T0)
    (stats,) = d.queue_stats()
    assert stats.to_dict() == {"exec": "image.resize", "ready": 1, "delayed": 1, "running": 1}
    assert d.counts()["queued"] == 2 and d.counts()["running"] == 1
    assert d.workers()[0].running == ("a",) and len(d) == 3
    assert d.next_timer_at() == T0 + 9.0


def test_job_returns_a_copy() -> None:
    d = make()
    d.submit(SubmitRequest(id="j1", exec="x", payload=1), T0)
    copy = d.job("j1")
    assert copy is not None
    copy.status = JobStatus.DEAD
    assert d.job("j1").status is JobStatus.QUEUED  # type: ignore[union-attr]
    assert d.job_view("j1") is d.job_view("j1")


def test_next_timer_at_is_the_earliest_of_deadlines_delays_and_expiries() -> None:
    d = make(worker_expiry_s=100.0, ack_timeout_s=30.0)
    assert d.next_timer_at() is None
    worker(d, "w", credits=1)
    assert d.next_timer_at() == T0 + 100
    d.submit(request("j1"), T0)
    assert d.next_timer_at() == T0 + 30
    d.submit(request("j2", delay_s=5.0), T0)
    assert d.next_timer_at() == T0 + 5


def test_counts_and_membership() -> None:
    d = make()
    d.submit(request("j1"), T0)
    assert "j1" in d and "j2" not in d and len(d) == 1
    assert d.counts() == {"queued": 1, "running": 0, "succeeded": 0, "dead": 0, "cancelled": 0}
    assert [job.id for job in d.jobs()] == ["j1"]
    assert d.inflight("nobody") == 0

"""Read-only queries: the DLQ listing, queue stats, counts, copies of records."""

from __future__ import annotations

from dispatch.core import (
    Dispatcher,
    JobStatus,
    SubmitRequest,
)
from dispatch.core.queries import ClientLoad
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
    assert d.counts() == {
        "queued": 1, "running": 0, "succeeded": 0, "dead": 0, "cancelled": 0, "expired": 0,
    }  # fmt: skip
    assert [job.id for job in d.jobs()] == ["j1"]
    assert d.inflight("nobody") == 0


# --- client loads (GET /v1/tenants, the per-tenant gauges) ------------------------------------


def _loads_as_pairs(core: Dispatcher) -> dict[tuple[str, str], tuple[int, int]]:
    return {
        key: (load.queued, load.running) for key, load in core.client_loads().by_client_exec.items()
    }


def test_queued_delayed_capped_and_running_jobs_are_counted_per_client_and_exec() -> None:
    core = make(default_cap=1)
    core.submit_many(
        [
            request("a1", "resize.run", client_id="acme"),
            request("a2", "resize.run", client_id="acme", priority=5),
            request("a3", "encode.run", client_id="acme", delay_s=60.0),
            request("g1", "resize.run", client_id="globex"),
        ],
        T0,
    )
    # Two credits: acme (cap 1) gets one job, globex one; acme's second waits at its cap.
    worker(core, "w", subjects=["job.assign.resize.>"], credits=2)
    assert _loads_as_pairs(core) == {
        ("acme", "resize.run"): (1, 1),
        ("acme", "encode.run"): (1, 0),
        ("globex", "resize.run"): (0, 1),
    }
    totals = core.client_loads().per_client()
    assert (totals["acme"].queued, totals["acme"].running) == (2, 1)


def test_a_cancelled_job_and_a_finished_one_count_nowhere() -> None:
    core = make()
    core.submit_many(
        [
            request("soon", "resize.run", client_id="acme"),
            request("later", "resize.run", client_id="acme", delay_s=60.0),
        ],
        T0,
    )
    core.cancel("soon", T0)
    core.cancel("later", T0)
    assert core.client_loads().by_client_exec == {}


def test_loads_add_up() -> None:
    total = ClientLoad(1, 2)
    total.add(ClientLoad(3, 4))
    assert total == ClientLoad(4, 6)

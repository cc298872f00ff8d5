"""Rebuilding a leader from a snapshot (Delta `jobs` rows) plus the log after it."""

from __future__ import annotations

import pytest

from dispatch.core import (
    Dispatcher,
    Event,
    JobRecord,
    JobStatus,
    WorkerRecord,
    check_invariants,
    state_view,
)
from tests.unit.core.helpers import T0, assigned_ids, assignments, make, request, worker


def snapshot(d: Dispatcher) -> list[JobRecord]:
    """What the Delta jobs table would hold: rows as plain dicts, parsed back."""
    return [JobRecord.from_dict(job.to_dict()) for job in d.jobs()]


def busy_leader() -> tuple[Dispatcher, list[Event]]:
    d = make(ack_timeout_s=30.0, max_attempts=2, default_cap=2)
    log = worker(d, "w1", credits=3) + worker(d, "w2", ["job.assign.mail.*"], credits=1)
    log += d.submit_many([request(f"j{n}", client_id=f"c{n % 2}") for n in range(6)], T0)
    log += d.submit(request("later", delay_s=50.0), T0)
    first = assignments(log)[0]
    log += d.fail(first.job_id, 1, first.lease, T0 + 1, error="boom", retryable=False)
    return d, log


def test_a_restored_leader_holds_the_same_jobs() -> None:
    old, _ = busy_leader()
    new = Dispatcher.restore(snapshot(old), config=old.config, epoch=old.epoch)
    check_invariants(new)
    assert state_view(new)["jobs"] == state_view(old)["jobs"]
    assert new.counts() == old.counts() and new.inflight("c0") == old.inflight("c0")
    assert [job.id for job in new.dead_letters()] == [job.id for job in old.dead_letters()]


def test_an_ack_for_an_assignment_of_the_old_leader_is_accepted() -> None:
    old, _ = busy_leader()
    running = next(job for job in old.jobs() if job.status is JobStatus.RUNNING)
    new = Dispatcher.restore(snapshot(old), config=old.config, epoch=old.epoch)
    new.begin_epoch(old.epoch + 1, T0 + 2)
    events = new.ack(running.id, running.attempts, running.lease or "", T0 + 3, result="ok")
    assert events[0].type == "completed"


def test_snapshot_plus_the_log_tail_equals_the_live_state() -> None:
    old, log = busy_leader()
    cut = len(log)
    rows = snapshot(old)
    # The old leader goes on after the snapshot was taken.
    tail = worker(old, "w3", credits=2, now=T0 + 5)
    tail += old.tick(T0 + 31)
    tail += old.lose_worker("w1", T0 + 32)
    assert len(tail) > 0 and cut == len(log)
    new = Dispatcher.restore(rows, config=old.config, epoch=old.epoch)
    new.apply_all(tail)
    check_invariants(new)
    live, rebuilt = state_view(old), state_view(new)
    assert rebuilt["jobs"] == live["jobs"] and rebuilt["inflight"] == live["inflight"]


def test_running_jobs_keep_their_workers_as_placeholders_until_they_join() -> None:
    old, _ = busy_leader()
    new = Dispatcher.restore(snapshot(old), config=old.config)
    placeholder = new.worker("w1")
    assert placeholder is not None and placeholder.subjects == () and placeholder.credit == 0
    assert set(placeholder.running) == set(old.worker("w1").running)  # type: ignore[union-attr]
    assert assigned_ids(new.grant_credit("w1", 1, T0 + 2)) == [], "no subjects: no new work"
    events = new.join("w1", ["job.assign.>"], T0 + 2)
    assert [(e.worker_id, e.attempt) for e in assignments(events)] == [("w1", 1)]


def test_workers_can_be_restored_with_their_credit_and_subjects() -> None:
    old, _ = busy_leader()
    new = Dispatcher.restore(
        snapshot(old),
        config=old.config,
        workers=[WorkerRecord.from_dict(w.to_dict()) for w in old.workers()],
    )
    assert state_view(new)["workers"] == state_view(old)["workers"]


def test_queue_order_survives_a_restore() -> None:
    old = make(default_cap=100)
    old.submit_many([request(f"j{n}") for n in range(5)], T0)
    worker(old, "w", credits=2)
    old.lose_worker("w", T0 + 1)  # j0 and j1 go back to the front
    new = Dispatcher.restore(snapshot(old), config=old.config)
    assert assigned_ids(worker(new, "fresh", credits=5, now=T0 + 2)) == [
        "j0",
        "j1",
        "j2",
        "j3",
        "j4",
    ]


def test_resume_gives_workers_a_fresh_expiry_window() -> None:
    old = make(worker_expiry_s=15.0, ack_timeout_s=600.0)
    worker(old, "w", credits=1)
    old.submit(request("j1"), T0)
    rows = snapshot(old)
    restored_workers = [WorkerRecord.from_dict(w.to_dict()) for w in old.workers()]

    unresumed = Dispatcher.restore(rows, config=old.config, workers=restored_workers)
    assert [e.type for e in unresumed.tick(T0 + 60)] == ["requeued", "worker_lost"]

    resumed = Dispatcher.restore(rows, config=old.config, workers=restored_workers)
    assert [e.type for e in resumed.resume(T0 + 60)] == ["worker_heartbeat"]
    assert resumed.tick(T0 + 70) == [], "the worker has 15 s to come back"
    assert resumed.job("j1").status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_restore_refuses_inconsistent_snapshots() -> None:
    old, _ = busy_leader()
    rows = snapshot(old)
    with pytest.raises(ValueError, match="appears twice"):
        Dispatcher.restore([*rows, rows[0]])
    broken = rows[0].copy()
    broken.attempts = broken.max_attempts + 1
    with pytest.raises(ValueError, match="exceeds max_attempts"):
        Dispatcher.restore([broken])


def test_a_restored_leader_finishes_the_work() -> None:
    old, _ = busy_leader()
    new = Dispatcher.restore(snapshot(old), config=old.config)
    new.resume(T0 + 2)
    worker(new, "fresh", credits=50, now=T0 + 2)
    for step in range(20):
        now = T0 + 10 + 60 * step
        for job in list(new.jobs()):
            if job.status is JobStatus.RUNNING and job.worker_id == "fresh":
                new.ack(job.id, job.attempts, job.lease or "", now)
        new.tick(now)
    assert all(job.is_terminal for job in new.jobs())

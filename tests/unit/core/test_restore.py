"""Rebuilding a leader from a snapshot (Delta `jobs` rows) plus the log after it."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest

from dispatch.core import (
    DeadReason,
    Dispatcher,
    Event,
    JobRecord,
    JobStatus,
    RejectCode,
    Rejected,
    WorkerRecord,
    check_invariants,
    state_view,
)
from dispatch.core.events import JobHeartbeat
from dispatch.core.job import check_record
from dispatch.core.leases import seeded_lease_tokens
from dispatch.core.restore import load_snapshot
from dispatch.core.state import DispatcherState
from tests.unit.core.helpers import (
    T0,
    assigned_ids,
    assignments,
    make,
    request,
    types,
    worker,
)


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


def test_worker_owners_survive_a_restore_with_workers_and_a_replayed_tail() -> None:
    old = make()
    old.join("w1", ["job.assign.>"], T0, owner="k1")
    old.grant_credit("w1", 1, T0)
    old.submit(request("j1"), T0)
    # With worker records: owners come back as they were.
    new = Dispatcher.restore(
        snapshot(old),
        config=old.config,
        workers=[WorkerRecord.from_dict(w.to_dict()) for w in old.workers()],
    )
    assert new.worker_owner("w1") == "k1"
    # Jobs only (what a leader's rebuild reads), then the tail of the log: a join in the tail
    # brings its owner back.
    tail = old.join("w2", ["job.assign.>"], T0 + 1, owner="k2")
    rebuilt = Dispatcher.restore(snapshot(old), config=old.config)
    rebuilt.apply_all(tail)
    assert rebuilt.worker_owner("w2") == "k2"


def test_a_placeholder_has_no_owner_until_its_key_joins_it_again() -> None:
    old, _ = busy_leader()
    new = Dispatcher.restore(snapshot(old), config=old.config)
    assert new.worker("w1") is not None and new.worker_owner("w1") is None
    # Its running jobs are settled by their leases, whichever key sends them.
    job = next(j for j in new.jobs() if j.status is JobStatus.RUNNING and j.worker_id == "w1")
    assert types(new.ack(job.id, job.attempts, job.lease or "", T0 + 2, owner="k1")) == [
        "completed"
    ]
    new.join("w1", ["job.assign.>"], T0 + 2, owner="k1")
    assert new.worker_owner("w1") == "k1"
    with pytest.raises(Rejected) as caught:
        new.join("w1", ["job.assign.>"], T0 + 3, owner="k2")
    assert caught.value.code is RejectCode.FORBIDDEN


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


def test_resume_moves_deadlines_that_fall_in_the_failover_later_by_its_length() -> None:
    old = make(worker_expiry_s=15.0, ack_timeout_s=5.0)
    worker(old, "w", credits=2)
    old.submit(request("due"), T0)
    old.submit(request("later", timeout_s=300.0), T0)
    rows = snapshot(old)
    # The old leader died at T0 + 4; the new one serves at T0 + 8: "due"'s deadline (T0 + 5)
    # passed while its worker could not reach any leader.
    new = Dispatcher.restore(rows, config=old.config)
    resumed = new.resume(T0 + 8, outage_s=4.0)
    moved = [event for event in resumed if isinstance(event, JobHeartbeat)]
    assert [(event.job_id, event.deadline) for event in moved] == [("due", T0 + 9)]
    assert new.tick(T0 + 8.5) == [], "the worker has what was left of its time to ack"
    job = new.job("due")
    assert job is not None and job.status is JobStatus.RUNNING
    # A stuck attempt still times out, the failover's length later (to the queue: the
    # restored worker has not granted credit yet).
    assert [event.type for event in new.tick(T0 + 9)] == ["requeued"]
    # Replayed, the deadline is the same: it is in the log.
    replayed = Dispatcher.restore(rows, config=old.config)
    replayed.apply_all(resumed)
    assert replayed.job("due").deadline == T0 + 9  # type: ignore[union-attr]
    # Without it (as before), the first tick takes the job from its worker before it is back.
    bare = Dispatcher.restore(rows, config=old.config)
    bare.resume(T0 + 8)
    assert [event.type for event in bare.tick(T0 + 8.5)] == ["requeued"]


def test_resume_leaves_a_worker_time_to_reconnect_before_any_deadline() -> None:
    old = make(worker_expiry_s=15.0, ack_timeout_s=5.0)
    worker(old, "w", credits=2)
    old.submit(request("due"), T0)
    old.submit(request("later", timeout_s=300.0), T0)
    new = Dispatcher.restore(snapshot(old), config=old.config)
    resumed = new.resume(T0 + 8, outage_s=1.0, reconnect_s=10.0)
    moved = [event for event in resumed if isinstance(event, JobHeartbeat)]
    # T0 + 5 + 1 s of outage is sooner than the worker can be back: T0 + 8 + 10.
    assert [(event.job_id, event.deadline) for event in moved] == [("due", T0 + 18)]
    assert new.tick(T0 + 17) == []


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


# --- what the restore must keep exactly: orders, ownership, the first error -------------------


def reference_load(
    state: DispatcherState, jobs: Iterable[JobRecord], workers: Iterable[WorkerRecord] = ()
) -> None:
    """The straightforward restore, one record at a time, that `load_snapshot` replaced: the
    faster one must build exactly the same state, orders included."""
    records: list[JobRecord] = []
    seen: set[str] = set()
    for original in jobs:
        assert original.id not in seen
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
        added = state._add_worker(record.worker_id, record.subjects, record.last_seen)
        added.credit = record.credit
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
        if job.status is JobStatus.RUNNING:
            running_on = state._worker_for(job.worker_id or "", clock)
            running_on.running[job.id] = job
            state._queues[job.exec].running += 1
            state._clients[job.client_id].inflight += 1
            assert job.deadline is not None
            state._deadlines.push(job.deadline, job, counts["running"])
        elif job.status is JobStatus.DEAD:
            state._dead[job.id] = job
        elif job.status is not JobStatus.QUEUED:
            state._finished.append(job)


def internals(d: Dispatcher) -> dict[str, Any]:
    """Everything a restore builds, in the order it holds it (`state_view` sorts)."""
    state = d.state
    return {
        "jobs": [(job_id, job.to_dict()) for job_id, job in state._jobs.items()],
        "finished": [job.id for job in state._finished],
        "dead": list(state._dead),
        "queues": [(q.exec, q.ready, q.delayed, q.running) for q in state._queues.values()],
        "rotation": [queue.exec for queue in state._rotation],
        "clients": [(c.client_id, c.cap, c.inflight) for c in state._clients.values()],
        "workers": [
            (w.worker_id, w.subjects, w.credit, w.last_seen, list(w.running))
            for w in state._workers.values()
        ],
        "deadlines": [(at, n, job.id) for at, n, job in state._deadlines.heap],
        "delays": [(at, seq, job.id) for at, seq, job in state._delays.heap],
        "clock": state._clock,
        "seqs": (state._next_seq, state._front_seq, state._assign_seq),
        "counts": dict(state._counts),
    }


def eventful_leader() -> Dispatcher:
    """Every status, ties in `updated_at`, requeued (negative) seqs, two exec queues whose
    first jobs by seq are not in name order, a delayed job, two workers with running jobs."""
    d = make(ack_timeout_s=30.0, max_attempts=2, default_cap=100)
    execs = ["zeta.run", "alpha.run"]
    d.submit_many([request(f"j{n:02}", execs[n % 2], client_id=f"c{n % 3}") for n in range(16)], T0)
    d.submit(request("later", "alpha.run", delay_s=500.0), T0)
    d.submit(request("gone", "alpha.run", ttl_s=1.0), T0)  # expires as the workers come
    d.submit(request("expiring", "zeta.run", delay_s=600.0, ttl_s=900.0), T0)
    worker(d, "w1", credits=5, now=T0 + 1)
    worker(d, "w2", credits=5, now=T0 + 1)
    running = [job for job in d.jobs() if job.status is JobStatus.RUNNING]
    acks = [(job.id, job.attempts, job.lease or "", {"n": job.id}) for job in running[:4]]
    d.ack_many(acks, T0 + 2)  # four jobs finish at the same instant
    for job in running[4:6]:
        d.fail(job.id, job.attempts, job.lease or "", T0 + 3, error="bad", retryable=False)
    d.cancel("j15", T0 + 3)
    d.lose_worker("w2", T0 + 4)  # its jobs go back to the front (negative seqs)
    worker(d, "w3", credits=3, now=T0 + 5)
    statuses = {job.status for job in d.jobs()}
    assert statuses == set(JobStatus), statuses
    return d


def test_restore_builds_what_the_one_by_one_restore_built() -> None:
    old = eventful_leader()
    rows = snapshot(old)
    expected = Dispatcher(old.config, epoch=old.epoch)
    reference_load(expected.state, rows)
    for seed in range(6):
        shuffled = snapshot(old)
        random.Random(seed).shuffle(shuffled)
        for owned in (False, True):
            new = Dispatcher.restore(shuffled, config=old.config, epoch=old.epoch, owned=owned)
            check_invariants(new)
            assert internals(new) == internals(expected), (seed, owned)
    # And it goes on the same way: the same jobs to the same workers, in the same order.
    new = Dispatcher.restore(snapshot(old), config=old.config, epoch=old.epoch)
    for d in (new, expected):
        d.state._lease_token = seeded_lease_tokens(1)  # the same leases, to compare the records
        d.begin_epoch(old.epoch + 1, T0 + 6)
        worker(d, "w1", credits=20, now=T0 + 7)
    assert assigned_ids(worker(new, "w9", credits=50, now=T0 + 8)) == assigned_ids(
        worker(expected, "w9", credits=50, now=T0 + 8)
    )
    assert internals(new) == internals(expected)


def test_restore_breaks_ties_of_seq_as_the_one_by_one_restore_did() -> None:
    # Never written by a leader (seqs are unique), but restore accepts it: same ties, same state.
    old = eventful_leader()
    rows = sorted(snapshot(old), key=lambda job: job.updated_at, reverse=True)
    for row in rows:
        row.seq = abs(row.seq) // 3
    expected = Dispatcher(old.config)
    reference_load(expected.state, rows)
    assert internals(Dispatcher.restore(rows, config=old.config)) == internals(expected)


def test_restore_lists_jobs_by_seq_and_finished_jobs_by_time_then_seq() -> None:
    old = eventful_leader()
    rows = snapshot(old)
    random.Random(3).shuffle(rows)
    new = Dispatcher.restore(rows, config=old.config)
    by_seq = sorted(rows, key=lambda job: job.seq)
    by_time = sorted(rows, key=lambda job: (job.updated_at, job.seq))
    assert [job.id for job in new.jobs()] == [job.id for job in by_seq]
    closed = (JobStatus.SUCCEEDED, JobStatus.CANCELLED, JobStatus.EXPIRED)
    assert [job.id for job in new.latest_finished(100)] == [
        job.id for job in reversed(by_time) if job.status in closed
    ]
    assert [job.id for job in new.dead_letters()] == [
        job.id for job in by_time if job.status is JobStatus.DEAD
    ]


def test_owned_records_give_the_same_state_as_copies_and_are_the_ones_held() -> None:
    old, _ = busy_leader()
    copied = Dispatcher.restore(snapshot(old), config=old.config, epoch=old.epoch)
    rows = snapshot(old)
    owned = Dispatcher.restore(rows, config=old.config, epoch=old.epoch, owned=True)
    check_invariants(owned)
    assert internals(owned) == internals(copied)
    assert state_view(owned) == state_view(copied)
    assert state_view(owned)["jobs"] == state_view(old)["jobs"]
    assert all(owned.job_view(row.id) is row for row in rows)


def test_records_not_owned_are_not_shared_with_the_caller() -> None:
    old, _ = busy_leader()
    rows = snapshot(old)
    before = [row.to_dict() for row in rows]
    new = Dispatcher.restore(rows, config=old.config, epoch=old.epoch)
    assert all(new.job_view(row.id) is not row for row in rows)
    running = next(job for job in new.jobs() if job.status is JobStatus.RUNNING)
    new.begin_epoch(old.epoch + 1, T0 + 2)
    new.ack(running.id, running.attempts, running.lease or "", T0 + 3, result="ok")
    assert [row.to_dict() for row in rows] == before, "the dispatcher changed the caller's rows"
    for row in rows:
        row.priority = 7
    assert all(job.priority == 0 for job in new.jobs()), "the caller changed the dispatcher"


def test_jobs_share_one_string_per_exec_and_client() -> None:
    old = eventful_leader()
    rows = snapshot(old)
    for row in rows:  # equal strings, distinct objects (as read from a table)
        row.exec = "".join(row.exec)
        row.client_id = "".join(row.client_id)
    assert len({id(row.exec) for row in rows}) == len(rows)
    new = Dispatcher.restore(rows, owned=True)
    for name in ("exec", "client_id"):
        values = [getattr(job, name) for job in new.jobs()]
        assert len({id(value) for value in values}) == len(set(values)) > 1, name


def broken(status: JobStatus, **fields: Any) -> JobRecord:
    job = JobRecord(
        id=f"{status.value}-{'-'.join(fields)}", client_id="c", exec="a.b", payload=None,
        max_attempts=2, timeout_s=5.0, submitted_at=T0, updated_at=T0, seq=1, status=status,
        attempts=1, worker_id=None if status is JobStatus.QUEUED else "w",
        lease="1.1" if status is JobStatus.RUNNING else None,
        deadline=T0 + 5 if status is JobStatus.RUNNING else None,
        dead_reason=DeadReason.ACK_TIMEOUT if status is JobStatus.DEAD else None,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(job, name, value)
    return job


INCONSISTENT = [
    broken(status, **fields)
    for status in JobStatus
    for fields in (
        {"attempts": 3},
        {"deadline": T0 + 1.0, "lease": "1.1", "worker_id": "w"},
        {"deadline": None},
        {"dead_reason": DeadReason.WORKER_LOST},
        {"dead_reason": None},
        {"worker_id": "w"},
        {"attempts": 0},
        {"lease": None},
    )
]
"""Records of every status with one field changed; some of them are still consistent."""


@pytest.mark.parametrize("record", INCONSISTENT, ids=lambda job: job.id)
def test_restore_accepts_exactly_what_check_record_accepts(record: JobRecord) -> None:
    try:
        check_record(record)
    except ValueError as error:
        with pytest.raises(ValueError) as refused:
            Dispatcher.restore([record], owned=True)
        assert str(refused.value) == str(error)
    else:
        assert len(Dispatcher.restore([record], owned=True)) == 1


def test_restore_names_the_first_bad_record_in_the_given_order() -> None:
    old, _ = busy_leader()
    rows = snapshot(old)
    bad = broken(JobStatus.SUCCEEDED, deadline=T0)
    with pytest.raises(ValueError, match=r"\.deadline: only a running job"):
        Dispatcher.restore([*rows, bad, rows[0]])
    with pytest.raises(ValueError, match="appears twice"):
        Dispatcher.restore([*rows, rows[0], bad], owned=True)
    with pytest.raises(ValueError, match="expected JobRecord, got dict"):
        Dispatcher.restore([rows[0], rows[1].to_dict(), bad])  # type: ignore[list-item]
    status_as_text = rows[0].copy()
    status_as_text.status = "succeeded"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="not a JobStatus"):
        Dispatcher.restore([status_as_text])


def test_a_refused_snapshot_changes_neither_the_state_nor_owned_records() -> None:
    old, _ = busy_leader()
    rows = [*snapshot(old), broken(JobStatus.CANCELLED, attempts=5)]
    for row in rows:
        row.exec = "".join(row.exec)
    before = [(row.to_dict(), id(row.exec)) for row in rows]
    d = make()
    empty = internals(d)
    with pytest.raises(ValueError, match="exceeds max_attempts"):
        load_snapshot(d.state, rows, owned=True)
    assert internals(d) == empty
    assert [(row.to_dict(), id(row.exec)) for row in rows] == before


def test_a_snapshot_with_a_repeated_id_is_refused_before_anything_changes() -> None:
    old, _ = busy_leader()
    rows = snapshot(old)
    rows.append(rows[0].copy())  # every record valid on its own
    for row in rows:
        row.exec = "".join(row.exec)
    before = [(row.to_dict(), id(row.exec)) for row in rows]
    d = make()
    empty = internals(d)
    with pytest.raises(ValueError, match=rows[0].id):
        load_snapshot(d.state, rows, owned=True)
    assert internals(d) == empty
    assert [(row.to_dict(), id(row.exec)) for row in rows] == before

"""Runtime limits in the fold, through delta-rs as the driver's fold writes (no Spark): the
`limits` table and the snapshot hold exactly the runtime limits in force at the snapshot's
offsets, also when a batch failed after writing `limits` and before its `jobs` commit and the
fold restarted with a new checkpoint and other batch boundaries; a restore from the snapshot
holds what the limits hold; `jobs` keeps each job's concurrency key; a deposed leader's limit
is not taken."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.commands import SubmitRequest
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Assigned, Event, LimitSet
from dispatch.core.limits import LimitScope
from dispatch.delta import tables as t
from dispatch.delta.snapshot import latest_snapshot
from dispatch.event_records import encode_batch
from dispatch.warehouse import Warehouse
from tests.unit.streaming.test_batch import create_empty_tables
from tests.unit.streaming.test_pauses import rows_of, writer_at
from tests.unit.streaming.workload import CONFIG, GROUP, Driver, Workload


def limiting_workload() -> tuple[Workload, list[list[LimitSet]]]:
    """Jobs of two execs, two clients and two keys; limits on an exec pattern, a client and a
    key pattern, one replaced with other knobs, one removed. Also the leader's runtime limits
    after each record of the log."""
    workload = Workload(leader=Dispatcher(CONFIG))
    driver = Driver(workload.leader, workload, [1_795_000_000.0])
    driver.begin(1)
    driver.join("w1", "job.assign.>")
    driver.set_limit("key", "account:*", max_inflight=1, reason="one per account")
    driver.set_limit("exec", "image.*", max_inflight=1)
    driver.submit("a1", "video.encode", "alice", key="account:1")
    driver.submit("a2", "video.encode", "alice", key="account:1")  # held by its key
    driver.submit("r1", "image.resize", "bob")
    driver.submit("r2", "image.crop", "bob")  # held by image.*
    driver.credit("w1", 8)
    driver.set_limit("client", "bob", max_inflight=5, rate=20.0, burst=40, reason="noisy")
    driver.ack("a1")  # a2 starts
    driver.set_limit("exec", "image.*", max_inflight=3, reason="more gpus")  # r2 starts
    driver.remove_limit("key", "account:*")
    driver.submit("a3", "video.encode", "alice", key="account:2")
    driver.set_limit("key", "account:2", max_inflight=1)
    driver.credit("w1", 2)
    after: list[list[LimitSet]] = []
    replayed = Dispatcher(CONFIG)
    for record in workload.log:
        replayed.apply_all(record.events)
        after.append(replayed.limits())
    assert after[-1] == workload.leader.limits()
    return workload, after


def snapshot_limits(warehouse: Warehouse) -> tuple[dict[int, int], list[LimitSet]]:
    snapshot = latest_snapshot(warehouse, GROUP)
    assert snapshot is not None
    return snapshot.offsets, snapshot.limits


def test_the_workload_is_held_by_its_limits() -> None:
    workload, _ = limiting_workload()
    starts = [
        (event.job_id, index)
        for index, record in enumerate(workload.log)
        for event in record.events
        if isinstance(event, Assigned)
    ]
    order = [job_id for job_id, _ in starts]
    assert order[:2] == ["a1", "r1"], "a2 waits for its key, r2 for image.*"
    assert set(order) == {"a1", "a2", "r1", "r2", "a3"}


def test_the_snapshot_holds_the_limits_in_force_at_its_offsets(tmp_path: Path) -> None:
    workload, after = limiting_workload()
    rows = rows_of([record.value() for record in workload.log])
    warehouse = Warehouse.at(tmp_path / "delta")
    create_empty_tables(warehouse)
    writer = writer_at(tmp_path, warehouse, "q1")
    for batch_id, end in enumerate(range(2, len(rows) + 1, 2)):
        writer.write_batch(batch_id, rows[end - 2 : end], {"ev": {0: end}})
        offsets, limits = snapshot_limits(warehouse)
        assert offsets == {0: end}
        assert limits == after[end - 1], f"after record {end - 1}"
    table = {
        (row["scope"], row["target"]): row
        for row in warehouse.open(t.LIMITS).to_pyarrow_table().to_pylist()
    }
    assert set(table) == {("client", "bob"), ("exec", "image.*"), ("key", "account:2")}
    bob = table["client", "bob"]
    assert (bob["max_inflight"], bob["rate"], bob["burst"]) == (5, 20.0, 40)
    assert (bob["by"], bob["reason"]) == ("ops-key", "noisy")
    assert table["exec", "image.*"]["max_inflight"] == 3
    assert table["exec", "image.*"]["rate"] is None
    # Each job's key is in `jobs`, as the leader has it.
    jobs = {row["id"]: row for row in warehouse.open(t.JOBS).to_pyarrow_table().to_pylist()}
    assert {job_id: row["key"] for job_id, row in jobs.items()} == {
        "a1": "account:1", "a2": "account:1", "a3": "account:2", "r1": None, "r2": None,
    }  # fmt: skip
    # The limit events are in `events`, with no job.
    events = sorted(
        warehouse.open(t.EVENTS).to_pyarrow_table().to_pylist(),
        key=lambda row: (row["offset"], row["idx"]),
    )
    kinds = [
        (row["type"], row["job_id"], json.loads(row["body"])["target"])
        for row in events
        if row["type"] in ("limit_set", "limit_removed")
    ]
    assert kinds == [
        ("limit_set", None, "account:*"), ("limit_set", None, "image.*"),
        ("limit_set", None, "bob"), ("limit_set", None, "image.*"),
        ("limit_removed", None, "account:*"), ("limit_set", None, "account:2"),
    ]  # fmt: skip


def test_a_restore_from_the_snapshot_holds_what_the_limits_hold(tmp_path: Path) -> None:
    workload, _ = limiting_workload()
    warehouse = Warehouse.at(tmp_path / "delta")
    create_empty_tables(warehouse)
    rows = rows_of([record.value() for record in workload.log])
    writer_at(tmp_path, warehouse, "q1").write_batch(0, rows, {"ev": {0: len(rows)}})
    snapshot = latest_snapshot(warehouse, GROUP)
    assert snapshot is not None
    assert snapshot.limits == workload.leader.limits()
    assert {job.id: job.to_dict() for job in snapshot.jobs} == workload.expected_jobs()
    restored = Dispatcher.restore(
        snapshot.jobs, config=CONFIG, epoch=snapshot.fence_epoch, limits=snapshot.limits
    )
    assert restored.limits() == workload.leader.limits()
    now = 1_796_000_000.0
    restored.resume(now)
    restored.join("w1", ["job.assign.>"], now)
    restored.grant_credit("w1", 5, now)
    request = SubmitRequest(
        id="a4", exec="video.encode", payload=None, client_id="alice", key="account:2"
    )
    submitted = restored.submit(request, now + 1)
    assert not [event for event in submitted if isinstance(event, Assigned)], (
        "account:2 is at its limit (a3 runs)"
    )
    released = restored.remove_limit("key", "account:2", now + 2)
    assert [event.job_id for event in released if isinstance(event, Assigned)] == ["a4"]


def test_a_batch_that_failed_after_writing_limits_leaves_the_snapshot_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 1 rewrites `limits` and fails before its `jobs` commit: the snapshot (of batch
    0) still has the limits of batch 0's offsets; a fold restarted from a new checkpoint, with
    other batch boundaries, writes the right limits from there."""
    workload, after = limiting_workload()
    rows = rows_of([record.value() for record in workload.log])
    warehouse = Warehouse.at(tmp_path / "delta")
    create_empty_tables(warehouse)
    first = writer_at(tmp_path, warehouse, "q1")
    split = 6  # after the first two limits
    first.write_batch(0, rows[:split], {"ev": {0: split}})
    assert snapshot_limits(warehouse) == ({0: split}, after[split - 1])

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the jobs MERGE failed")

    monkeypatch.setattr(first, "_merge_jobs", broken)
    with pytest.raises(RuntimeError):
        first.write_batch(1, rows[split:], {"ev": {0: len(rows)}})
    written = {
        (row["scope"], row["target"])
        for row in warehouse.open(t.LIMITS).to_pyarrow_table().to_pylist()
    }
    assert written == {("client", "bob"), ("exec", "image.*"), ("key", "account:2")}
    assert snapshot_limits(warehouse) == ({0: split}, after[split - 1])

    second = writer_at(tmp_path, warehouse, "q2")
    middle = split + 5
    second.write_batch(0, rows[split:middle], {"ev": {0: middle}})
    assert snapshot_limits(warehouse) == ({0: middle}, after[middle - 1])
    second.write_batch(1, rows[middle:], {"ev": {0: len(rows)}})
    assert snapshot_limits(warehouse) == ({0: len(rows)}, workload.leader.limits())


def test_a_deposed_leader_s_limit_is_not_taken(tmp_path: Path) -> None:
    old = Dispatcher(CONFIG)
    log: list[tuple[int, list[Event]]] = [(1, old.begin_epoch(1, 100.0))]
    new = Dispatcher(CONFIG)
    new.apply_all(log[0][1])
    log.append((2, new.begin_epoch(2, 101.0)))
    log.append((1, old.set_limit("exec", "a.*", 102.0, max_inflight=1)))  # the zombie's
    log.append((2, new.set_limit("client", "c", 103.0, rate=5.0)))
    values = [encode_batch(GROUP, epoch, events) for epoch, events in log]
    warehouse = Warehouse.at(tmp_path / "delta")
    create_empty_tables(warehouse)
    rows = rows_of(values)
    writer_at(tmp_path, warehouse, "q1").write_batch(0, rows, {"ev": {0: len(rows)}})
    assert snapshot_limits(warehouse)[1] == new.limits()
    assert [event.scope for event in new.limits()] == [LimitScope.CLIENT]
    assert new.limits()[0].burst == 5

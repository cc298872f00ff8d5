"""Pauses in the fold, through delta-rs as the driver's fold writes (no Spark): the `pauses`
table and the snapshot hold exactly the pauses in force at the snapshot's offsets, also when
a batch failed after writing `pauses` and before its `jobs` commit and the fold restarted
with a new checkpoint and other batch boundaries; a restore from the snapshot holds what was
paused; a deposed leader's pause is not taken."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Assigned, Event, Paused, PauseScope
from dispatch.delta import tables as t
from dispatch.delta.snapshot import latest_snapshot
from dispatch.event_records import encode_batch
from dispatch.storage import Location
from dispatch.streaming.batch import BatchWriter
from dispatch.streaming.decode import KafkaRow
from dispatch.warehouse import Warehouse
from tests.unit.streaming.test_batch import TOPICS, WHEN, create_empty_tables
from tests.unit.streaming.workload import CONFIG, GROUP, Driver, Workload


def pausing_workload() -> tuple[Workload, list[list[Paused]]]:
    """Jobs of two execs and two clients; pauses of an exec pattern and a client, a resume,
    the pattern paused again; heartbeats with progress. Also the leader's pauses after each
    record of the log."""
    workload = Workload(leader=Dispatcher(CONFIG))
    driver = Driver(workload.leader, workload, [1_795_000_000.0])
    driver.begin(1)
    driver.join("w1", "job.assign.>")
    driver.submit("r1", "image.resize", "alice")
    driver.submit("v1", "video.encode", "bob")
    driver.credit("w1", 2)
    driver.heartbeat("r1", {"done": 1, "total": 4, "message": "one"})
    driver.pause("exec", "image.*", reason="bad deploy")
    driver.submit("r2", "image.resize", "alice")
    driver.pause("client", "bob")
    driver.submit("v2", "video.encode", "bob")
    driver.credit("w1", 2)  # nothing paused to start: v2 (bob) and r2 (image.*) wait
    driver.heartbeat("r1", {"done": 3, "total": 4})
    driver.unpause("exec", "image.*")  # r2 starts
    driver.ack("r1")
    driver.pause("exec", "image.>", reason="again")
    driver.submit("r3", "image.crop", "carol")
    driver.credit("w1", 2)
    after: list[list[Paused]] = []
    replayed = Dispatcher(CONFIG)
    for record in workload.log:
        replayed.apply_all(record.events)
        after.append(replayed.pauses())
    assert after[-1] == workload.leader.pauses()
    return workload, after


def rows_of(values: list[bytes]) -> list[KafkaRow]:
    return [
        KafkaRow("ev", 0, offset, b"default", value, WHEN) for offset, value in enumerate(values)
    ]


def writer_at(tmp_path: Path, warehouse: Warehouse, query: str) -> BatchWriter:
    checkpoint = tmp_path / f"checkpoint-{query}"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": query}) + "\n")
    return BatchWriter(warehouse, TOPICS, Location.at(checkpoint))


def snapshot_pauses(warehouse: Warehouse) -> tuple[dict[int, int], list[Paused]]:
    snapshot = latest_snapshot(warehouse, GROUP)
    assert snapshot is not None
    return snapshot.offsets, snapshot.pauses


def test_the_snapshot_holds_the_pauses_in_force_at_its_offsets(tmp_path: Path) -> None:
    workload, after = pausing_workload()
    values = [record.value() for record in workload.log]
    rows = rows_of(values)
    warehouse = Warehouse.at(tmp_path / "delta")
    create_empty_tables(warehouse)
    writer = writer_at(tmp_path, warehouse, "q1")
    for batch_id, end in enumerate(range(3, len(rows) + 1, 3)):
        writer.write_batch(batch_id, rows[end - 3 : end], {"ev": {0: end}})
        offsets, pauses = snapshot_pauses(warehouse)
        assert offsets == {0: end}
        assert pauses == after[end - 1], f"after record {end - 1}"
    table = {
        (row["scope"], row["target"]): row
        for row in warehouse.open(t.PAUSES).to_pyarrow_table().to_pylist()
    }
    assert set(table) == {("client", "bob"), ("exec", "image.>")}
    assert table["exec", "image.>"]["reason"] == "again"
    assert table["exec", "image.>"]["by"] == "ops-key"
    # The progress reports are in `jobs`, as the leader has them.
    jobs = {row["id"]: row for row in warehouse.open(t.JOBS).to_pyarrow_table().to_pylist()}
    assert json.loads(jobs["r1"]["progress"])["done"] == 3.0
    assert jobs["v2"]["progress"] is None
    # The pause events are in `events`, with no job.
    events = sorted(
        warehouse.open(t.EVENTS).to_pyarrow_table().to_pylist(),
        key=lambda row: (row["offset"], row["idx"]),
    )
    kinds = [(row["type"], row["job_id"]) for row in events if row["type"] in ("paused", "resumed")]
    assert kinds == [("paused", None), ("paused", None), ("resumed", None), ("paused", None)]


def test_a_restore_from_the_snapshot_holds_what_is_paused(tmp_path: Path) -> None:
    workload, _ = pausing_workload()
    warehouse = Warehouse.at(tmp_path / "delta")
    create_empty_tables(warehouse)
    rows = rows_of([record.value() for record in workload.log])
    writer_at(tmp_path, warehouse, "q1").write_batch(0, rows, {"ev": {0: len(rows)}})
    snapshot = latest_snapshot(warehouse, GROUP)
    assert snapshot is not None
    assert snapshot.pauses == workload.leader.pauses()
    restored = Dispatcher.restore(
        snapshot.jobs, config=CONFIG, epoch=snapshot.fence_epoch, pauses=snapshot.pauses
    )
    assert restored.pauses() == workload.leader.pauses()
    now = 1_796_000_000.0
    restored.resume(now)
    restored.join("w1", ["job.assign.>"], now)
    started = [e for e in restored.grant_credit("w1", 5, now + 1) if isinstance(e, Assigned)]
    assert started == [], "the paused exec pattern and the paused client start nothing"
    assert {job.id for job in restored.jobs() if job.status.value == "queued"} == {"r3", "v2"}
    released = restored.unpause("client", "bob", now + 2)
    assert [e.job_id for e in released if isinstance(e, Assigned)] == ["v2"]


def test_a_batch_that_failed_after_writing_pauses_leaves_the_snapshot_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 1 rewrites `pauses` and fails before its `jobs` commit: the snapshot (of batch
    0) still has the pauses of batch 0's offsets; a fold restarted from a new checkpoint, with
    other batch boundaries, writes the right pauses from there."""
    workload, after = pausing_workload()
    rows = rows_of([record.value() for record in workload.log])
    warehouse = Warehouse.at(tmp_path / "delta")
    create_empty_tables(warehouse)
    first = writer_at(tmp_path, warehouse, "q1")
    split = 7  # after the first pause (record 5) ...
    first.write_batch(0, rows[:split], {"ev": {0: split}})
    assert snapshot_pauses(warehouse) == ({0: split}, after[split - 1])

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the jobs MERGE failed")

    monkeypatch.setattr(first, "_merge_jobs", broken)
    with pytest.raises(RuntimeError):
        first.write_batch(1, rows[split:], {"ev": {0: len(rows)}})
    written = {
        (row["scope"], row["target"])
        for row in warehouse.open(t.PAUSES).to_pyarrow_table().to_pylist()
    }
    assert written == {("client", "bob"), ("exec", "image.>")}, "batch 1 wrote pauses"
    assert snapshot_pauses(warehouse) == ({0: split}, after[split - 1])

    second = writer_at(tmp_path, warehouse, "q2")
    middle = split + 4
    second.write_batch(0, rows[split:middle], {"ev": {0: middle}})
    assert snapshot_pauses(warehouse) == ({0: middle}, after[middle - 1])
    second.write_batch(1, rows[middle:], {"ev": {0: len(rows)}})
    assert snapshot_pauses(warehouse) == ({0: len(rows)}, workload.leader.pauses())


def test_a_deposed_leader_s_pause_is_not_taken(tmp_path: Path) -> None:
    old = Dispatcher(CONFIG)
    log: list[tuple[int, list[Event]]] = [(1, old.begin_epoch(1, 100.0))]
    new = Dispatcher(CONFIG)
    new.apply_all(log[0][1])
    log.append((2, new.begin_epoch(2, 101.0)))
    log.append((1, old.pause("exec", "a.*", 102.0)))  # the zombie's, after the election
    log.append((2, new.pause("client", "c", 103.0)))
    values = [encode_batch(GROUP, epoch, events) for epoch, events in log]
    warehouse = Warehouse.at(tmp_path / "delta")
    create_empty_tables(warehouse)
    rows = rows_of(values)
    writer_at(tmp_path, warehouse, "q1").write_batch(0, rows, {"ev": {0: len(rows)}})
    assert snapshot_pauses(warehouse)[1] == new.pauses()
    assert [event.scope for event in new.pauses()] == [PauseScope.CLIENT]

"""The fold's executor stages (dispatch.streaming.partition_fold) against the driver's: the `events`
rows of stage 1 are the driver's (bar `admitted`), and folding a batch split into partitions by
job gives exactly the driver's jobs, archived lives, refusals and statistics."""

from __future__ import annotations

import datetime as dt
import json
import random
import zlib
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch.core.events import Completed, LeaderElected, Pruned
from dispatch.delta import tables as t
from dispatch.delta.job_rows import OPEN, JobKey, JobState, job_row, job_state
from dispatch.delta.stats import StatsAccumulator
from dispatch.streaming.decode import KafkaRow, LoggedEvent, Refused
from dispatch.streaming.executor_plan import run_fence
from dispatch.streaming.fold import ArchivedLife, BatchFold, fence_batch, fold_batch
from dispatch.streaming.partition_fold import (
    FOLD_INPUT,
    KAFKA_COLUMNS,
    KIND_ARCHIVED,
    KIND_JOB,
    KIND_OPEN_SEQS,
    KIND_REFUSED,
    KIND_STATS,
    SEQ_RANGES,
    PruneEvent,
    explode_other_records,
    explode_records,
    fold_partition,
    prune_steps,
)
from dispatch.streaming.rollup import aggregate, stats_row
from tests.unit.streaming.hostile import hostile_record
from tests.unit.streaming.test_batch import WHEN, InMemoryWriter, events_rows_of, poison_values
from tests.unit.streaming.test_fold import Tables, fold_in_batches, logged_events
from tests.unit.streaming.workload import GROUP, mixed_workload, random_workload

# --- stage 1 -----------------------------------------------------------------------------------


KAFKA_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("timestamp", pa.int64()),
    ]
)


def record_batch(rows: list[KafkaRow]) -> pa.RecordBatch:
    """Kafka records as the driver selects them for the stages (time in microseconds)."""
    return pa.RecordBatch.from_pylist(
        [
            {
                "topic": row.topic,
                "partition": row.partition,
                "offset": row.offset,
                "key": row.key,
                "value": row.value,
                "timestamp": int(row.timestamp.timestamp() * 1_000_000),
            }
            for row in rows
        ],
        schema=KAFKA_SCHEMA,
    )


def kafka_batch(values: list[bytes | None]) -> pa.RecordBatch:
    """Some events records as the stages get them."""
    return record_batch(events_rows_of(values))


def assert_explodes_as_the_driver(values: list[bytes | None]) -> None:
    exploded = pa.Table.from_batches(
        list(explode_records([kafka_batch(values)], batch_id=4)), schema=t.SCHEMAS[t.EVENTS]
    )
    writer = InMemoryWriter()
    driver = writer.events_rows(4, writer._plan(events_rows_of(values)))

    def comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # `admitted` is the driver's to set (the fence is batch-wide), and so is the `error`
        # of an event the fold refuses; the other kinds' errors are stage 1's.
        kept = [
            {**row, "admitted": None, "error": None if row["kind"] == "event" else row["error"]}
            for row in rows
        ]
        return sorted(kept, key=lambda row: (row["offset"], row["idx"], row["kind"]))

    assert comparable(exploded.to_pylist()) == comparable(driver)


def test_exploded_rows_are_the_drivers_events_rows_but_for_admitted() -> None:
    values, _ = poison_values()
    mixed = mixed_workload(prune=True)
    values += [record.value() for record in mixed.log]
    assert tuple(kafka_batch(values).schema.names) == KAFKA_COLUMNS
    assert_explodes_as_the_driver(values)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_record(), min_size=1, max_size=4))
def test_hostile_records_explode_as_the_driver_reads_them(poison: list[bytes | None]) -> None:
    assert_explodes_as_the_driver([*poison, mixed_workload().log[0].value()])


def test_submit_and_rejected_records_explode_as_the_driver_reads_them() -> None:
    workload = mixed_workload()
    rows = [
        KafkaRow(topic, 0, offset, key, value, WHEN)
        for topic, records in (
            ("sub", workload.submits),
            ("rej", [(None, value) for value in workload.rejections] + [(b"k", None)]),
        )
        for offset, (key, value) in enumerate(records)
    ]
    batch = record_batch(rows)
    exploded = pa.Table.from_batches(
        list(explode_other_records([batch], 3, "sub")), schema=t.SCHEMAS[t.EVENTS]
    )
    writer = InMemoryWriter()
    driver = writer.events_rows(3, writer._plan(rows))

    def by_place(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(rows, key=lambda row: (row["topic"], row["partition"], row["offset"]))

    assert by_place(exploded.to_pylist()) == by_place(driver)
    assert {row["kind"] for row in driver} >= {"submit", "rejected"}


def test_an_empty_kafka_batch_explodes_to_nothing() -> None:
    assert list(explode_records([kafka_batch([])], batch_id=0)) == []


# --- stage 2 -----------------------------------------------------------------------------------


def body(logged: LoggedEvent) -> str:
    """An event's `events.body`, as stage 1 writes it."""
    return json.dumps(logged.event.to_dict(), separators=(",", ":"))


def partition_of(key: JobKey, partitions: int) -> int:
    """A stand-in for Spark's hash partitioning: any split by job must give the same fold."""
    return zlib.crc32(f"{key[0]}/{key[1]}".encode()) % partitions


def assert_open_seqs_covered(rows: list[dict[str, Any]], out: list[dict[str, Any]]) -> None:
    """A partition's `open_seqs` ranges cover the `seq` of each of its open rows (the MERGE
    skips the files outside them), at most `SEQ_RANGES` of them and a NULL row for a NULL."""
    ranges = [(row["seq_low"], row["seq_high"]) for row in out if row["kind"] == KIND_OPEN_SEQS]
    stored = [row["row"]["seq"] for row in rows if row["row"] and row["row"]["part"] == OPEN]
    assert len([r for r in ranges if r[0] is not None]) <= SEQ_RANGES
    for seq in stored:
        if seq is None:
            assert (None, None) in ranges
        else:
            assert any(low is not None and low <= seq <= high for low, high in ranges), seq
    if not stored:
        assert ranges == []


class Partitioned:
    """`fold_batch` as the executors would run it: the batch's admitted job events and touched
    rows split by job into `partitions`, each folded by `fold_partition` from Arrow rows, the
    outputs put back together as a `BatchFold` (and checked against the driver's)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.batches = 0

    def __call__(
        self, events: list[LoggedEvent], admitted: list[bool], current: dict[JobKey, JobState]
    ) -> BatchFold:
        expected = fold_batch(events, admitted, current)
        inputs: list[list[dict[str, Any]]] = [[] for _ in range(self.partitions)]
        prunes: list[PruneEvent] = []
        for logged, ok in zip(events, admitted, strict=True):
            if not ok:
                continue
            if isinstance(logged.event, Pruned):
                place = (logged.partition, logged.offset, logged.index)
                prunes.append(PruneEvent(*place, logged.group, logged.record_epoch, body(logged)))
                continue
            job_id = getattr(logged.event, "job_id", None)
            if job_id is None:
                continue
            inputs[partition_of((logged.group, job_id), self.partitions)].append(
                {
                    "dispatch_group": logged.group, "job_id": job_id,
                    "partition": logged.partition, "offset": logged.offset, "idx": logged.index,
                    "record_epoch": logged.record_epoch, "body": body(logged), "row": None,
                }
            )  # fmt: skip
        for key, state in current.items():
            row = job_row(key[0], state)
            inputs[partition_of(key, self.partitions)].append(
                {"dispatch_group": key[0], "job_id": key[1], "body": None, "row": row}
            )
        outputs: list[dict[str, Any]] = []
        for rows in inputs:
            random.Random(len(rows)).shuffle(rows)  # the stage sorts by place itself
            table = pa.Table.from_pylist(rows, schema=FOLD_INPUT)
            partition_out: list[dict[str, Any]] = []
            for batch in fold_partition(table.to_batches(max_chunksize=5), prunes, {}):
                partition_out.extend(batch.to_pylist())
            assert_open_seqs_covered(rows, partition_out)
            outputs.extend(partition_out)
        got = self.rebuild(outputs, events)
        got.prunes = prune_steps(prunes)
        assert_same_fold(got, expected)
        self.batches += 1
        return got

    @staticmethod
    def rebuild(outputs: list[dict[str, Any]], events: list[LoggedEvent]) -> BatchFold:
        by_place = {(e.partition, e.offset, e.index): e for e in events}
        fold = BatchFold()
        for row in outputs:
            if row["kind"] == KIND_JOB:
                job = row["job"]
                key = (job["dispatch_group"], job["id"])
                fold.final[key] = None if job.pop("_delete") else job_state(job)[1]
            elif row["kind"] == KIND_ARCHIVED:
                archived = dict(row["archived"])
                at, _ = archived.pop("archived_at"), archived.pop("date")
                archived["part"] = "closed"
                _, state = job_state(archived)
                fold.archived.append(ArchivedLife(archived["dispatch_group"], state, at))
            elif row["kind"] == KIND_REFUSED:
                place = (row["partition"], row["offset"], row["idx"])
                fold.refused.append(Refused(by_place[place], row["reason"]))
            else:
                assert row["kind"] in (KIND_STATS, KIND_OPEN_SEQS)
        stats = [row["stats"] for row in outputs if row["kind"] == KIND_STATS]
        fold.stats = StatsAccumulator()
        fold.stats.rows = aggregate(stats)
        fold.refused.sort(key=lambda refused: (refused.logged.partition, refused.logged.offset,
                                               refused.logged.index))  # fmt: skip
        return fold


def assert_same_fold(got: BatchFold, expected: BatchFold) -> None:
    def rows(fold: BatchFold) -> dict[JobKey, dict[str, Any] | None]:
        return {
            key: None if state is None else job_row(key[0], state)
            for key, state in fold.final.items()
        }

    assert rows(got) == rows(expected)

    def lives(fold: BatchFold) -> list[tuple[str, str, float, dict[str, Any]]]:
        return sorted(
            (life.group, life.state.record.id, life.archived_at, job_row(life.group, life.state))
            for life in fold.archived
        )

    assert lives(got) == lives(expected)
    assert [(r.logged, r.reason) for r in got.refused] == [
        (r.logged, r.reason) for r in expected.refused
    ]
    assert {key: stats_row(key, s) for key, s in got.stats.rows.items()} == {
        key: stats_row(key, s) for key, s in expected.stats.rows.items()
    }


@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("prune", [False, True])
def test_the_mixed_workload_folds_the_same_split_by_job(partitions: int, prune: bool) -> None:
    workload = mixed_workload(prune=prune)
    fold = Partitioned(partitions)
    tables = fold_in_batches(workload, random.Random(partitions), 9, Tables(fold))
    assert tables.records() == workload.expected_jobs()
    assert fold.batches > 3


@pytest.mark.parametrize("seed", range(6))
def test_random_workloads_fold_the_same_split_by_job(seed: int) -> None:
    workload = random_workload(seed)
    fold = Partitioned(1 + seed % 4)
    tables = fold_in_batches(workload, random.Random(seed), 1 + seed * 11, Tables(fold))
    assert tables.records() == workload.expected_jobs()


def test_an_event_that_does_not_fit_is_refused_by_its_partition() -> None:
    """A `completed` for a job no partition holds a row of is refused, with the driver's
    reason, and the partition's other jobs fold."""
    workload = mixed_workload()
    events = logged_events(workload)
    stray = Completed(epoch=1, at=events[-1].event.at, job_id="job-nobody",
                      worker_id="w", attempt=1, lease="l", result=None)  # fmt: skip
    events.append(LoggedEvent(0, len(workload.log), 0, GROUP, 1, stray))
    fold = Partitioned(2)(events, [True] * len(events), {})
    (refused,) = fold.refused
    assert refused.logged.event is stray and "does not fit its job" in refused.reason
    assert ("default", "job-nobody") not in fold.final and len(fold.final) >= 12


def test_a_row_that_does_not_read_back_refuses_its_jobs_events() -> None:
    workload = mixed_workload()
    logged = logged_events(workload)
    job = next(e for e in logged if getattr(e.event, "job_id", None) is not None)
    broken = {"dispatch_group": GROUP, "id": job.event.job_id, "status": "nonsense"}  # type: ignore[attr-defined]
    rows = [
        {"dispatch_group": GROUP, "job_id": broken["id"], "body": None,
         "row": {name: broken.get(name) for name in t.SCHEMAS[t.JOBS].names}},
        {"dispatch_group": GROUP, "job_id": broken["id"], "partition": 0, "offset": job.offset,
         "idx": job.index, "record_epoch": 1, "body": body(job), "row": None},
    ]  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=FOLD_INPUT)
    (out,) = [batch.to_pylist() for batch in fold_partition(table.to_batches(), [], {})]
    (refused,) = [row for row in out if row["kind"] == KIND_REFUSED]
    assert refused["reason"].startswith("its jobs row does not read back")
    assert not [row for row in out if row["kind"] == KIND_JOB]


def test_statistics_already_counted_are_not_counted_again() -> None:
    workload = mixed_workload()
    logged = [event for event in logged_events(workload) if event.record_epoch == 1]
    rows = [
        {"dispatch_group": GROUP, "job_id": e.event.job_id, "partition": 0, "offset": e.offset,  # type: ignore[attr-defined]
         "idx": e.index, "record_epoch": 1, "body": body(e), "row": None}
        for e in logged if getattr(e.event, "job_id", None) is not None
    ]  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=FOLD_INPUT)
    half = len(workload.log) // 2

    def submitted(stats_from: dict[int, int]) -> int:
        out = [row for batch in fold_partition(table.to_batches(), [], stats_from)
               for row in batch.to_pylist() if row["kind"] == KIND_STATS]  # fmt: skip
        return sum(row["stats"]["submitted"] for row in out)

    everything = submitted({})
    assert 0 < submitted({0: half}) < everything
    assert submitted({0: 10**9}) == 0


def test_stats_rows_of_partitions_merge_into_one_row_per_key() -> None:
    minute = dt.datetime(2026, 1, 1, 0, 1, tzinfo=dt.UTC)
    row: dict[str, Any] = dict.fromkeys(t.SCHEMAS[t.STATS_PARTIAL].names)
    row.update(date=minute.date(), minute=minute, dispatch_group="g", exec="e", client_id="c",
               submitted=2, queue_wait_n=0, run_time_n=0)  # fmt: skip
    merged = aggregate([row, {**row, "submitted": 3}])
    assert len(merged) == 1 and next(iter(merged.values())).counters["submitted"] == 5


@pytest.mark.parametrize("prune", [False, True])
def test_the_fence_from_the_control_rows_is_the_drivers(prune: bool) -> None:
    """`run_fence` sees only the batch's elections and prunes; every event's verdict from its
    group's raised fence (what `Fence.admitted` writes as a Spark column) must equal the
    driver's `fence_batch`, zombie writes after the failover included."""
    events = logged_events(mixed_workload(prune=prune))
    admitted, after = fence_batch(events, {GROUP: 1})
    control = [
        {"partition": e.partition, "offset": e.offset, "idx": e.index,
         "dispatch_group": e.group, "record_epoch": e.record_epoch, "body": body(e)}
        for e in events if isinstance(e.event, LeaderElected | Pruned)
    ]  # fmt: skip
    random.Random(3).shuffle(control)  # collected rows come in no order
    fence, prunes = run_fence({GROUP: 1}, {e.group for e in events}, control)
    assert fence.after == after

    def verdict(event: LoggedEvent) -> bool:
        threshold = fence.before.get(event.group, 0)
        for place, epoch in fence.raised.get(event.group, []):
            if (event.partition, event.offset, event.index) >= place:
                threshold = epoch
        return event.event.epoch >= threshold

    assert [verdict(event) for event in events] == admitted
    assert not all(admitted)  # the zombie's writes are fenced
    admitted_prunes = [
        (e.partition, e.offset, e.index)
        for e, ok in zip(events, admitted, strict=True)
        if ok and isinstance(e.event, Pruned)
    ]
    assert [(p.partition, p.offset, p.idx) for p in prunes] == admitted_prunes
    assert bool(prunes) == prune

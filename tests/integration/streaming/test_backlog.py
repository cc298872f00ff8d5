"""A backlog of queued jobs in the open partition of `jobs` (issue 15, item 5): a batch reads
and rewrites the files it touches, not the backlog, and the open partition the writer keeps in
memory gives the tables a read of `jobs` each batch gives — after a restart, after compaction
and after another writer changed open rows. Tables created by Spark on disk, written by the
writer's delta-rs commits; the log is the pure core's, as the leader writes it, handed to the
writer as records (`write_batch`, what `foreachBatch` calls after collecting the batch)."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import write_deltalake

from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Assigned, Event
from dispatch.delta import tables as t
from dispatch.delta.job_rows import CLOSED, OPEN, JobState, job_row
from dispatch.event_records import encode_batch
from dispatch.settings import Settings
from dispatch.storage import Location
from dispatch.streaming.app import topics_of
from dispatch.streaming.batch import EXECUTORS, BatchWriter
from dispatch.streaming.decode import KafkaRow, Topics
from dispatch.warehouse import Warehouse
from tests.integration.streaming.conftest import jobs_of, with_warehouse
from tests.integration.streaming.test_batch import checkpoint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

GROUP = "default"
WHEN = dt.datetime(2027, 1, 15, tzinfo=dt.UTC)
BACKLOG = 20_000
PER_BATCH = 300
FILE_BYTES = 64 << 10
"""Small files (~1,400 rows each): the backlog spreads over a dozen files in a small test."""


class ReadsEachBatch(BatchWriter):
    """The writer as it was: the open partition read each batch, the MERGE over all of it."""

    def __init__(self, warehouse: Warehouse, topics: Topics, checkpoint: Location) -> None:
        super().__init__(warehouse, topics, checkpoint, cache_open_jobs=False)

    def _merge_jobs(self, batch_id: int, end: Any, source: pa.Table, open_seqs: Any = None) -> None:
        super()._merge_jobs(batch_id, end, source, None)


class Leader:
    """The pure core with a backlog, driven a batch at a time: each batch completes the jobs
    the previous one assigned, assigns the next `PER_BATCH` from the head of the queue and
    submits as many behind the backlog."""

    def __init__(self) -> None:
        config = CoreConfig(
            ack_timeout_s=600.0, max_ack_timeout_s=600.0, worker_expiry_s=None, default_cap=10_000
        )
        self.core = Dispatcher(config)
        self.now = 1_800_000_000.0
        self.running: list[tuple[str, int, str, Any]] = []
        self.first = self.core.begin_epoch(1, self.now) + self.core.join(
            "w0", ["job.assign.>"], self.now
        )

    def requests(self, count: int) -> list[SubmitRequest]:
        return [
            SubmitRequest(
                id=uuid.uuid4().hex, exec="image.resize", payload={"n": n}, client_id=f"c{n % 3}"
            )
            for n in range(count)
        ]

    def backlog_rows(self, count: int) -> pa.Table:
        """Jobs queued before the first batch, as rows of `jobs` (the fold's own rows)."""
        requests = self.requests(count)
        self.core.submit_many(requests, self.now)
        rows = []
        for request in requests:
            record = self.core.job(request.id)
            assert record is not None
            rows.append(job_row(GROUP, JobState(record, queued_at=self.now)))
        return t.arrow_rows(t.JOBS, rows)

    def batch(self) -> list[Event]:
        self.now += 5.0
        events, _ = self.core.ack_many(self.running, self.now) if self.running else ([], [])
        events += self.core.grant_credit("w0", PER_BATCH, self.now, replace=True)
        events += self.core.submit_many(self.requests(PER_BATCH), self.now)
        self.running = [
            (event.job_id, event.attempt, event.lease, {"ok": True})
            for event in events
            if isinstance(event, Assigned)
        ]
        return events

    def expected(self) -> dict[str, dict[str, Any]]:
        return {job.id: job.to_dict() for job in self.core.jobs()}


class EventsLog:
    """The events topic's partition 0, as records the writer collects from Kafka."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.offset = 0

    def records(self, events: list[Event]) -> list[KafkaRow]:
        """`events` as the leader writes them: a record per 100."""
        out = []
        for start in range(0, len(events), 100):
            value = encode_batch(GROUP, 1, events[start : start + 100])
            out.append(KafkaRow(self.topic, 0, self.offset, GROUP.encode(), value, WHEN))
            self.offset += 1
        return out


def with_backlog(spark: SparkSession, settings: Settings, rows: pa.Table) -> None:
    """The tables, with `rows` queued in small files of `jobs`' open partition."""
    warehouse = Warehouse.of(settings)
    t.create_tables(spark, warehouse)
    jobs = warehouse.open(t.JOBS)
    jobs.alter.set_table_properties({"delta.targetFileSize": str(FILE_BYTES)})
    write_deltalake(jobs, rows, mode="append", target_file_size=FILE_BYTES)


def last_merge(settings: Settings) -> dict[str, Any]:
    """delta-rs's metrics of the newest `jobs` MERGE."""
    for commit in Warehouse.of(settings).open(t.JOBS).history(3):
        if commit.get("operation") == "MERGE":
            metrics: dict[str, Any] = commit["operationMetrics"]
            return metrics
    raise AssertionError("no MERGE among the newest commits of jobs")


def open_files(settings: Settings) -> int:
    return len(
        Warehouse.of(settings).open(t.JOBS).file_uris(file_pruning_predicate=[("part", "=", OPEN)])
    )


def files_admitted(settings: Settings) -> int:
    """How many files of the open partition the newest MERGE's `seq` ranges admit, from the
    files' statistics before it (what the narrowing leaves delta-rs to scan)."""
    table = Warehouse.of(settings).open(t.JOBS)
    merge = next(c for c in table.history(3) if c.get("operation") == "MERGE")
    condition = merge["operationParameters"]["mergePredicate"]
    ranges = [
        (int(low or single), int(high or single))
        for low, high, single in re.findall(
            r"t\.seq (?:>= (\d+) AND t\.seq <= (\d+)|= (\d+))", condition
        )
    ]
    assert ranges, condition
    table.load_as_version(merge["readVersion"])
    files = pa.table(table.get_add_actions(flatten=True))
    opened = files.filter(pc.field("partition.part") == OPEN).to_pylist()
    return sum(
        any(f["min.seq"] <= high and low <= f["max.seq"] for low, high in ranges) for f in opened
    )


def jobs_rows(settings: Settings) -> pa.Table:
    """`jobs` in key order, in the table's Arrow types (compared whole, column by column)."""
    read = Warehouse.of(settings).open(t.JOBS).to_pyarrow_table()
    ordered = read.sort_by([("dispatch_group", "ascending"), ("id", "ascending")])
    return ordered.select(t.SCHEMAS[t.JOBS].names).cast(t.SCHEMAS[t.JOBS])


def test_a_batch_over_a_backlog_touches_its_files_and_the_cache_agrees_with_a_read(
    settings: Settings, spark: SparkSession, tmp_path: Path
) -> None:
    cached_settings = settings
    read_settings = with_warehouse(settings, tmp_path / "read-each-batch")
    leader = Leader()
    backlog = leader.backlog_rows(BACKLOG)
    with_backlog(spark, cached_settings, backlog)
    shutil.copytree(cached_settings.paths.warehouse, read_settings.paths.warehouse)
    files_before = open_files(cached_settings)
    assert files_before >= 10

    def writer(where: Settings, kind: type[BatchWriter], name: str) -> BatchWriter:
        location = checkpoint(tmp_path / f"cp-{name}", f"query-{name}")
        return kind(Warehouse.of(where), topics_of(where), location)

    cached = writer(cached_settings, BatchWriter, "cached")
    reads = writer(read_settings, ReadsEachBatch, "read")
    log = EventsLog(cached_settings.kafka.events_topic)
    batch_id = 0

    def run(events: list[Event]) -> None:
        """One batch of `events`, through both writers."""
        nonlocal batch_id
        rows = log.records(events)
        for each in (cached, reads):
            each.write_batch(batch_id, rows, {log.topic: {0: log.offset}})
        batch_id += 1

    run(leader.first)
    for _ in range(3):
        run(leader.batch())
        assert jobs_rows(cached_settings).equals(jobs_rows(read_settings))
    assert jobs_of(jobs_rows(cached_settings).to_pylist()) == leader.expected()
    # The open partition was read once, when the first batch touched jobs.
    assert cached.open_jobs_loads == 1

    # What the batch's MERGE read and rewrote: the files of the jobs it assigned and completed
    # (the head of the queue), not the backlog's. Its condition admits only the files whose
    # `seq` statistics may hold a touched row. (The reference writer's own count is not
    # compared: delta-rs reports 0 files scanned, all skipped, for an un-narrowed MERGE over
    # a partition past some size although it rewrites files.)
    mine = last_merge(cached_settings)
    assert mine["num_target_files_scanned"] <= 4 < open_files(cached_settings) - 4
    assert mine["num_target_rows_copied"] < BACKLOG / 4
    assert files_admitted(cached_settings) <= 4 < open_files(cached_settings) - 4

    # A restart: the new writer reads the open partition once more, then follows its commits.
    cached = writer(cached_settings, BatchWriter, "cached")
    run(leader.batch())
    assert jobs_rows(cached_settings).equals(jobs_rows(read_settings))
    assert cached.open_jobs_loads == 1

    # Compaction commits the same rows: the cache stays.
    Warehouse.of(cached_settings).open(t.JOBS).optimize.compact()
    run(leader.batch())
    assert jobs_rows(cached_settings).equals(jobs_rows(read_settings))
    assert jobs_of(jobs_rows(cached_settings).to_pylist()) == leader.expected()
    assert cached.open_jobs_loads == 1

    # Another writer changes every open row: the cache is read again, so the jobs the next
    # batch assigns and completes keep that change, as a read of the table would.
    for each_settings in (cached_settings, read_settings):
        Warehouse.of(each_settings).open(t.JOBS).update(
            updates={"priority": "7"}, predicate=f"part = '{OPEN}'"
        )
    run(leader.batch())
    assert cached.open_jobs_loads == 2
    assert jobs_rows(cached_settings).equals(jobs_rows(read_settings))
    changed = jobs_rows(cached_settings).filter(pc.field("priority") == 7)
    assert CLOSED in changed.column("part").to_pylist()  # completed since the change


def spark_merge(settings: Settings) -> tuple[str, dict[str, int]]:
    """The condition and the metrics of the newest `jobs` MERGE (Spark's)."""
    for commit in Warehouse.of(settings).open(t.JOBS).history(3):
        if commit.get("operation") == "MERGE":
            metrics = {name: int(value) for name, value in commit["operationMetrics"].items()}
            return str(commit["operationParameters"]["predicate"]), metrics
    raise AssertionError("no MERGE among the newest commits of jobs")


class ChangedBeforeTheMerge(BatchWriter):
    """Another writer changes every open row of `jobs` (their priority) after the fold read
    them and before the batch's MERGE, when `change_open_rows` says so."""

    change_open_rows = False

    def _spark_merge_jobs(self, spark: Any, batch_id: int, end: Any, rows: Any) -> None:
        if self.change_open_rows:
            self.warehouse.open(t.JOBS).update(
                updates={"priority": "7"}, predicate=f"part = '{OPEN}'"
            )
        super()._spark_merge_jobs(spark, batch_id, end, rows)


def without_priority(jobs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {job_id: {**job, "priority": None} for job_id, job in jobs.items()}


def test_the_executors_fold_narrows_its_merge_over_a_backlog_unless_the_open_rows_moved(
    settings: Settings, spark: SparkSession, tmp_path: Path
) -> None:
    """The same backlog, every batch folded on the executors and written by Spark: the MERGE
    skips the files no touched job's row is in (by the `seq` ranges the fold's partitions
    report), so it does not rewrite the backlog. When another writer changed the open rows
    between the fold's read and the MERGE, those ranges may miss a row: the MERGE goes
    without them, and the tables stay right."""
    leader = Leader()
    with_backlog(spark, settings, leader.backlog_rows(BACKLOG))
    writer = ChangedBeforeTheMerge(
        Warehouse.of(settings),
        topics_of(settings),
        checkpoint(tmp_path / "cp-executors", "query-executors"),
        fold_on=EXECUTORS,
        executor_min_records=0,
    )
    log = EventsLog(settings.kafka.events_topic)
    batch_id = 0

    def run(events: list[Event]) -> None:
        nonlocal batch_id
        records = [
            (row.topic, row.partition, row.offset, row.key, row.value, row.timestamp)
            for row in log.records(events)
        ]
        kafka_schema = (
            "topic string, partition int, offset long, key binary, value binary, "
            "timestamp timestamp"
        )
        writer(spark.createDataFrame(records, kafka_schema), batch_id)
        assert writer.last is not None and writer.last.on_executors
        batch_id += 1

    run(leader.first)
    run(leader.batch())
    assert jobs_of(jobs_rows(settings).to_pylist()) == leader.expected()
    # Spark's MERGE records no count of the files it skipped: its condition shows the ranges
    # (a target-only condition Delta skips files by), the rows it copied what it rewrote.
    condition, metrics = spark_merge(settings)
    assert "seq" in condition and metrics["numTargetRowsCopied"] < BACKLOG / 4

    writer.change_open_rows = True
    run(leader.batch())
    condition, _ = spark_merge(settings)
    assert "seq" not in condition
    found = jobs_of(jobs_rows(settings).to_pylist())
    assert without_priority(found) == without_priority(leader.expected())


def test_create_tables_gives_an_older_jobs_table_its_file_size(
    spark: SparkSession, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable

    warehouse = Warehouse.at(tmp_path / "delta")
    (
        DeltaTable.createIfNotExists(spark)
        .location(warehouse.table(t.JOBS))
        .addColumns(t.spark_schema(t.JOBS))
        .partitionedBy(*t.PARTITIONS[t.JOBS])
        .execute()
    )
    assert "delta.targetFileSize" not in warehouse.open(t.JOBS).metadata().configuration
    t.create_tables(spark, warehouse)
    configuration = warehouse.open(t.JOBS).metadata().configuration
    assert configuration["delta.targetFileSize"] == str(t.JOBS_FILE_BYTES)
    version = warehouse.open(t.JOBS).version()
    t.create_tables(spark, warehouse)  # already set: no commit
    assert warehouse.open(t.JOBS).version() == version

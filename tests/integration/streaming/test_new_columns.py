"""A `jobs` table made before the later columns (retry and expiry; the hard time limit and
the cancel of a running job; the worker's progress report; the concurrency key) gets them
when the fold starts, and new `pauses` and `limits` tables appear beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from dispatch.core.job import JobRecord
from dispatch.delta import tables as t
from dispatch.delta.job_rows import JobState, job_row, record_from_row
from dispatch.warehouse import Warehouse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

LATER = (
    "retry", "expires_at", "max_run_s", "run_limit_at", "cancel_requested_at", "progress", "key",
)  # fmt: skip


def test_create_tables_adds_the_new_columns_to_an_old_jobs_table(
    spark: SparkSession, tmp_path: Path
) -> None:
    warehouse = Warehouse.at(tmp_path)
    old = JobRecord(
        id="old", client_id="c", exec="a.b", payload=None, max_attempts=3, timeout_s=5.0,
        submitted_at=1.0, updated_at=2.0, seq=1,
    )  # fmt: skip
    row = job_row("g", JobState(old))
    for name in LATER:
        del row[name]
    schema = pa.schema([field for field in t.SCHEMAS[t.JOBS] if field.name not in LATER])
    write_deltalake(
        warehouse.table(t.JOBS),
        pa.Table.from_pylist([row], schema=schema),
        partition_by=t.PARTITIONS[t.JOBS],
    )

    t.create_tables(spark, warehouse)
    t.create_tables(spark, warehouse)  # a second start changes nothing

    table = warehouse.open(t.JOBS)
    # In the schema's order: before the partition column, as in a new table.
    assert [field.name for field in table.schema().fields] == t.SCHEMAS[t.JOBS].names
    [read] = table.to_pyarrow_table().to_pylist()
    assert record_from_row(read) == old, "an old row reads as a job without them"
    # The fold writes rows of today's schema into it.
    new = JobRecord.from_dict({**old.to_dict(), "id": "new", "expires_at": 9.0})
    write_deltalake(
        warehouse.table(t.JOBS),
        t.arrow_rows(t.JOBS, [job_row("g", JobState(new))]),
        mode="append",
    )
    # A running job with a time limit whose cancel was asked for: every new column set.
    running = JobRecord.from_dict(
        {
            **old.to_dict(),
            "id": "running",
            "status": "running",
            "attempts": 1,
            "worker_id": "w",
            "lease": "l",
            "deadline": 20.0,
            "max_run_s": 30.0,
            "run_limit_at": 32.0,
            "cancel_requested_at": 15.0,
            "progress": {"done": 2, "total": 8, "message": "two of eight", "at": 14.0},
            "key": "account:42",
        }
    )
    write_deltalake(
        warehouse.table(t.JOBS),
        t.arrow_rows(t.JOBS, [job_row("g", JobState(running))]),
        mode="append",
    )
    rows = {row["id"]: row for row in warehouse.open(t.JOBS).to_pyarrow_table().to_pylist()}
    assert rows["new"]["expires_at"] == 9.0 and rows["old"]["expires_at"] is None
    for name in LATER:
        assert rows["old"][name] is None
    assert (
        rows["running"]["max_run_s"],
        rows["running"]["run_limit_at"],
        rows["running"]["cancel_requested_at"],
    ) == (30.0, 32.0, 15.0)
    assert json.loads(rows["running"]["progress"]) == {
        "done": 2.0, "total": 8.0, "message": "two of eight", "at": 14.0,
    }  # fmt: skip
    assert rows["running"]["key"] == "account:42"
    assert record_from_row(rows["running"]) == running
    assert record_from_row(rows["old"]) == old
    # Spark reads the old table with the new columns too (NULL in the old rows).
    frame = spark.read.format("delta").load(warehouse.table(t.JOBS))
    assert frame.columns == t.SCHEMAS[t.JOBS].names
    by_id = {row["id"]: row for row in frame.collect()}
    assert by_id["running"]["cancel_requested_at"] == 15.0
    assert by_id["old"]["max_run_s"] is None
    assert by_id["old"]["progress"] is None
    assert by_id["running"]["key"] == "account:42" and by_id["old"]["key"] is None
    # The pauses and limits tables are there, empty.
    assert warehouse.open(t.PAUSES).to_pyarrow_table().num_rows == 0
    assert warehouse.open(t.LIMITS).to_pyarrow_table().num_rows == 0


def test_the_fold_writes_a_job_with_a_time_limit_into_an_old_jobs_table(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A job using the new fields, folded from its events into a `jobs` table made before
    them, and read back as the core's record (the driver's MERGE: delta-rs)."""
    from dispatch.core.commands import SubmitRequest
    from dispatch.core.config import CoreConfig
    from dispatch.core.dispatcher import Dispatcher
    from dispatch.delta.job_rows import records_from_arrow
    from dispatch.streaming.decode import LoggedEvent
    from dispatch.streaming.fold import fold_batch

    warehouse = Warehouse.at(tmp_path)
    schema = pa.schema([field for field in t.SCHEMAS[t.JOBS] if field.name not in LATER])
    write_deltalake(
        warehouse.table(t.JOBS), schema.empty_table(), partition_by=t.PARTITIONS[t.JOBS]
    )
    t.create_tables(spark, warehouse)

    core = Dispatcher(CoreConfig(worker_expiry_s=None, cancel_grace_s=5.0))
    events = core.begin_epoch(1, 100.0) + core.join("w", ["job.assign.>"], 100.0)
    request = SubmitRequest(
        id="limited", exec="a.b", payload=None, max_run_s=30.0, key="account:42"
    )
    events += core.submit(request, 101.0) + core.grant_credit("w", 1, 101.0)
    held = core.job("limited")
    assert held is not None and held.lease is not None
    events += core.heartbeat("limited", 1, held.lease, 101.5, progress={"done": 1, "total": 4})
    events += core.cancel("limited", 102.0, by="ops")
    logged = [LoggedEvent(0, i, 0, "g", 1, event) for i, event in enumerate(events)]
    folded = fold_batch(logged, [True] * len(logged), {})
    assert not folded.refused
    state = folded.final[("g", "limited")]
    assert state is not None
    write_deltalake(
        warehouse.table(t.JOBS), t.arrow_rows(t.JOBS, [job_row("g", state)]), mode="append"
    )
    [record] = records_from_arrow(warehouse.open(t.JOBS).to_pyarrow_table())
    job = core.job("limited")
    assert job is not None and record == job
    assert (record.max_run_s, record.run_limit_at, record.cancel_requested_at) == (
        30.0,
        131.0,
        102.0,
    )
    assert record.progress == {"done": 1.0, "total": 4.0, "message": None, "at": 101.5}
    assert record.key == "account:42"

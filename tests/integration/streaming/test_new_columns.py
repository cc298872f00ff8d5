"""A `jobs` table made before the retry and expiry columns gets them when the fold starts."""

from __future__ import annotations

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

LATER = ("retry", "expires_at")


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
    rows = {row["id"]: row for row in warehouse.open(t.JOBS).to_pyarrow_table().to_pylist()}
    assert rows["new"]["expires_at"] == 9.0 and rows["old"]["expires_at"] is None

"""Reading the tables: Spark SQL views for notebooks, delta-rs readers for services.

The dead-letter queue is not a table of its own: it is `jobs` where `status = 'dead'` (all in
the small `open` partition), so it can never disagree with the jobs. Notebooks get it, and the
others, as temporary views:

    register_views(spark, warehouse)
    spark.sql("SELECT id, exec, dead_reason, error FROM dlq ORDER BY updated_at")
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatch.core.job import JobRecord
from streaming import tables as t
from streaming.fold import OPEN, record_from_row

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

VIEWS: dict[str, str] = {
    "dlq": f"SELECT * FROM jobs WHERE part = '{OPEN}' AND status = 'dead'",
    "jobs_all": (
        "SELECT *, CAST(NULL AS DOUBLE) AS archived_at FROM jobs"
        " UNION ALL SELECT *, 'archived' AS part FROM"
        " (SELECT * EXCEPT (date) FROM jobs_archive)"
    ),
}
"""Views over the tables: `dlq`, and `jobs_all` (current jobs and pruned lives together)."""


def register_views(spark: SparkSession, warehouse: Path) -> list[str]:
    """Temporary views named like the tables (events, jobs, jobs_archive, stats, rejected),
    plus `dlq` and `jobs_all`. Returns their names."""
    names: list[str] = []
    for name in t.SCHEMAS:
        path = t.table_path(warehouse, name)
        spark.read.format("delta").load(str(path)).createOrReplaceTempView(name)
        names.append(name)
    for name, query in VIEWS.items():
        spark.sql(query).createOrReplaceTempView(name)
        names.append(name)
    return names


def _jobs_rows(warehouse: Path, partition: str | None, filters: Any) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    table = DeltaTable(str(t.table_path(warehouse, t.JOBS)))
    dataset = table.to_pyarrow_dataset(
        file_pruning_predicate=None if partition is None else [("part", "=", partition)]
    )
    rows: list[dict[str, Any]] = dataset.to_table(filter=filters).to_pylist()
    return rows


def read_dlq(warehouse: Path, group: str | None = None) -> list[JobRecord]:
    """The dead-letter queue (oldest first) with delta-rs, as the core's records."""
    import pyarrow.compute as pc

    condition = pc.field("status") == "dead"
    if group is not None:
        condition = condition & (pc.field("dispatch_group") == group)
    rows = sorted(_jobs_rows(warehouse, OPEN, condition), key=lambda row: row["updated_at"])
    return [record_from_row(row) for row in rows]


def read_job(warehouse: Path, job_id: str, group: str | None = None) -> JobRecord | None:
    """One job's current record with delta-rs (None if `jobs` does not hold it; a pruned job
    is in `jobs_archive`)."""
    import pyarrow.compute as pc

    condition = pc.field("id") == job_id
    if group is not None:
        condition = condition & (pc.field("dispatch_group") == group)
    rows = _jobs_rows(warehouse, None, condition)
    return record_from_row(rows[0]) if rows else None

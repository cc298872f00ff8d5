"""Reading the tables: Spark SQL views for notebooks, delta-rs readers for services.

The dead-letter queue is not a table of its own: it is `jobs` where `status = 'dead'` (all in
the small `open` partition), so it can never disagree with the jobs. Notebooks get it, and the
others, as temporary views:

    register_views(spark, warehouse)
    spark.sql("SELECT id, exec, dead_reason, error FROM dlq ORDER BY updated_at")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dispatch.core.job import JobRecord
from dispatch.delta import tables as t
from dispatch.delta.job_rows import OPEN, record_from_row
from dispatch.delta_sql import query, sql_text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from dispatch.warehouse import Warehouse


def _jobs_all_sql() -> str:
    """`jobs` and `jobs_archive` as one relation, every column named in `jobs`' order: a
    UNION matches columns by position, and the two tables do not hold them in the same order
    (columns added later come after each table's own last ones)."""
    columns = [f"`{name}`" for name in t.SCHEMAS[t.JOBS].names]
    archived = ["'archived' AS part" if name == "`part`" else name for name in columns]
    return (
        f"SELECT {', '.join(columns)}, CAST(NULL AS DOUBLE) AS archived_at FROM jobs UNION ALL"
        f" SELECT {', '.join(archived)}, archived_at FROM jobs_archive"
    )


VIEWS: dict[str, str] = {
    "dlq": f"SELECT * FROM jobs WHERE part = '{OPEN}' AND status = 'dead'",
    "jobs_all": _jobs_all_sql(),
}
"""Views over the tables: `dlq`, and `jobs_all` (current jobs and pruned lives together)."""


def register_views(spark: SparkSession, warehouse: Warehouse) -> list[str]:
    """Temporary views named like the tables (events, jobs, jobs_archive, stats, rejected),
    plus `dlq` and `jobs_all`. Returns their names."""
    names: list[str] = []
    for name in t.SCHEMAS:
        spark.read.format("delta").load(warehouse.table(name)).createOrReplaceTempView(name)
        names.append(name)
    for name, view_sql in VIEWS.items():
        spark.sql(view_sql).createOrReplaceTempView(name)
        names.append(name)
    return names


def latency_percentiles(
    stats: DataFrame,
    by: list[str],
    latency: str = "run_time",
    quantiles: tuple[float, ...] = (0.5, 0.95, 0.99),
) -> DataFrame:
    """Percentiles of `latency` (`queue_wait` or `run_time`) over `stats` rows grouped `by`
    any columns (e.g. `["exec"]`, or an hour column): the rows' histograms are added up, then
    read as `dispatch.delta.stats.Histogram.percentile` does (nearest rank, bucket middle, clamped
    to the observed min and max). Columns: `by`, `n`, then `p50`, `p95`... in seconds.

        latency_percentiles(spark.table("stats").where("date = current_date()"), ["exec"])
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from dispatch.delta.stats import BUCKET_FLOOR_S, BUCKETS_PER_DOUBLING

    hist, count = f"{latency}_hist", f"{latency}_n"
    totals = stats.groupBy(*by).agg(
        F.sum(count).alias("n"),
        F.min(f"{latency}_min_s").alias("_min"),
        F.max(f"{latency}_max_s").alias("_max"),
    )
    buckets = (
        stats.select(*by, F.explode(hist).alias("bucket", "count"))
        .groupBy(*by, "bucket")
        .agg(F.sum("count").alias("count"))
    )
    ordered = Window.partitionBy(*by).orderBy("bucket")
    running = buckets.withColumn("seen", F.sum("count").over(ordered)).join(totals, by)
    middle = F.when(F.col("bucket") <= 0, F.lit(BUCKET_FLOOR_S / 2)).otherwise(
        F.lit(BUCKET_FLOOR_S)
        * F.pow(F.lit(2.0), (F.col("bucket") - F.lit(0.5)) / F.lit(BUCKETS_PER_DOUBLING))
    )
    picks = []
    for quantile in quantiles:
        rank = F.greatest(F.lit(1), F.ceil(F.lit(quantile) * F.col("n")))
        value = F.least(F.greatest(middle, F.col("_min")), F.col("_max")).alias("value")
        name = f"p{round(quantile * 100):d}"
        picks.append(F.min(F.when(F.col("seen") >= rank, F.struct("bucket", value))).alias(name))
    result = running.groupBy(*by, "n").agg(*picks)
    return result.select(
        *by,
        "n",
        *[F.col(f"p{round(q * 100):d}.value").alias(f"p{round(q * 100):d}") for q in quantiles],
    )


def _jobs_rows(warehouse: Warehouse, condition: str) -> list[dict[str, Any]]:
    table = warehouse.open(t.JOBS)
    rows: list[dict[str, Any]] = query(
        table, "jobs", f"SELECT * FROM jobs WHERE {condition}"
    ).to_pylist()
    return rows


def read_dlq(warehouse: Warehouse, group: str | None = None) -> list[JobRecord]:
    """The dead-letter queue (oldest first) with delta-rs, as the core's records."""
    condition = f"\"part\" = '{OPEN}' AND \"status\" = 'dead'"
    if group is not None:
        condition += f' AND "dispatch_group" = {sql_text(group)}'
    rows = sorted(_jobs_rows(warehouse, condition), key=lambda row: row["updated_at"])
    return [record_from_row(row) for row in rows]


def read_job(warehouse: Warehouse, job_id: str, group: str | None = None) -> JobRecord | None:
    """One job's current record with delta-rs (None if `jobs` does not hold it; a pruned job
    is in `jobs_archive`)."""
    condition = f'"id" = {sql_text(job_id)}'
    if group is not None:
        condition += f' AND "dispatch_group" = {sql_text(group)}'
    rows = _jobs_rows(warehouse, condition)
    return record_from_row(rows[0]) if rows else None

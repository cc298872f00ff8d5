"""The Delta writes Spark makes for a batch folded on the executors.

A batch folded on the driver is committed with delta-rs (`delta_commits.py`: its rows are in
the driver's memory already). A batch folded on the executors keeps its two large outputs
there: the `events` rows and the `jobs` MERGE source stay Spark DataFrames, written by Spark —
the executors write the files, the driver commits once per table. Only what is small or rare
reaches the driver: statistics, archived lives, refusals, the fence's control rows.

Exactly once is the same mechanism either way: each commit carries the Delta `txn` action
(app id, version = the batch id) that delta-rs's commits carry, and Spark skips a write or a
MERGE whose version the table has already recorded for the app (`txnAppId`/`txnVersion`, as
writer options for an append and as session settings for a MERGE). The commit's
`userMetadata` is the batch's progress, which the snapshot pointer and the fence read back
whoever wrote it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TXN_APP = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


@dataclass(frozen=True)
class ExecutorRows:
    """What a batch folded on the executors writes without collecting it."""

    jobs: DataFrame
    """The `jobs` MERGE source (`planned.JOBS_SOURCE` columns), one row per touched job."""
    jobs_rows: int
    events: DataFrame | None
    """The `events` rows the table has not absorbed yet; None when they were collected to
    the driver instead (a batch with refused events, whose rows need their reasons)."""
    events_rows: int
    jobs_version: int
    """The `jobs` version the fold read the touched jobs' rows at."""
    open_seqs: list[tuple[int, int]]
    """Ranges covering the `seq` the touched jobs' rows had in the open partition at
    `jobs_version` (the MERGE's file skipping, `BatchWriter._spark_merge_jobs`)."""
    open_seq_null: bool
    """Whether one of those rows had a NULL `seq`."""


@contextmanager
def keyed_on_batch(
    spark: SparkSession, app_id: str, batch_id: int, metadata: str
) -> Iterator[None]:
    """Key the Spark MERGE(s) inside on the batch and attach `metadata` to their commit.
    A MERGE takes no writer options: Delta reads these from the session."""
    conf = spark.conf
    conf.set(TXN_APP, app_id)
    conf.set(TXN_VERSION, str(batch_id))
    conf.set(USER_METADATA, metadata)
    try:
        yield
    finally:
        for key in (TXN_APP, TXN_VERSION, USER_METADATA):
            conf.unset(key)


def append(rows: DataFrame, path: str, *, app_id: str, version: int, metadata: str) -> None:
    """Append `rows` to the Delta table at `path` as the app's commit `version`; Spark skips it
    when the table has recorded that version for the app already."""
    (
        rows.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", str(version))
        .option("userMetadata", metadata)
        .save(path)
    )


def merge_jobs(
    spark: SparkSession,
    source: DataFrame,
    path: str,
    predicate: str,
    columns: Mapping[str, str],
    *,
    app_id: str,
    version: int,
    metadata: str,
) -> None:
    """The `jobs` MERGE of a batch, as `BatchWriter._merge_jobs` makes it with delta-rs: a
    source row with `_delete` removes the job, any other updates or inserts it."""
    from delta.tables import DeltaTable

    target = DeltaTable.forPath(spark, path)
    with keyed_on_batch(spark, app_id, version, metadata):
        (
            target.alias("t")
            .merge(source.alias("s"), predicate)
            .whenMatchedDelete(condition="s._delete")
            .whenMatchedUpdate(set=dict(columns))
            .whenNotMatchedInsert(condition="NOT s._delete", values=dict(columns))
            .execute()
        )

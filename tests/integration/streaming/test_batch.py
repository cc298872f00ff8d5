"""`BatchWriter` called directly: a replayed batch changes nothing, a batch cut between two
of its writes completes exactly once when replayed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from dispatch.core.events import Completed, Enqueued
from dispatch.core.fence import fence_events
from dispatch.delta import tables as t
from dispatch.settings import Settings
from dispatch.storage import Location
from dispatch.streaming.app import topics_of
from dispatch.streaming.batch import DRIVER, EXECUTORS, BatchWriter
from dispatch.streaming.rollup import StatsRollup
from dispatch.warehouse import Warehouse
from tests.integration.streaming.conftest import jobs_of, produce, produce_workload, spark_rows
from tests.unit.streaming.workload import mixed_workload

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.integration


def kafka_batch(spark: SparkSession, settings: Settings) -> DataFrame:
    """Everything the topics hold now, as the streaming source would hand it over."""
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka.bootstrap)
        .option("subscribe", ",".join(topics_of(settings).all()))
        .option("kafka.isolation.level", "read_committed")
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )


def checkpoint(base: Path, query_id: str) -> Location:
    """A checkpoint folder as Spark starts it (its metadata names the query id)."""
    base.mkdir(parents=True, exist_ok=True)
    (base / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    return Location.at(base)


def versions(settings: Settings) -> dict[str, int]:

    warehouse = Warehouse.of(settings)
    return {name: warehouse.open(name).version() for name in t.SCHEMAS}


def data_commit_engines(settings: Settings, name: str) -> list[str]:
    """Who made each commit of table `name` that wrote rows (Spark names itself in the commit's
    `engineInfo`; delta-rs writes none)."""
    history = Warehouse.of(settings).open(name).history()
    return [
        str(commit.get("engineInfo") or commit.get("clientVersion"))
        for commit in history
        if commit.get("operation") in ("WRITE", "MERGE")
    ]


class CrashBeforeJobs(BatchWriter):
    """Dies after events, rejected and stats are committed, before the jobs MERGE."""

    def _merge_jobs(self, batch_id: int, end: Any, source: pa.Table, open_seqs: Any = None) -> None:
        raise RuntimeError("killed before the jobs MERGE")

    def _spark_merge_jobs(self, spark: Any, batch_id: int, end: Any, source: Any) -> None:
        raise RuntimeError("killed before the jobs MERGE (Spark's, for a fold on executors)")


@pytest.mark.parametrize("fold_on", [DRIVER, EXECUTORS])
def test_replays_and_a_cut_batch_change_the_tables_exactly_once(
    topics: Settings, spark: SparkSession, tmp_path: Path, fold_on: str
) -> None:
    settings = topics
    workload = mixed_workload()
    half = len(workload.log) // 2
    produce(settings, workload.log[:half], submits=workload.submits[:4])
    warehouse = Warehouse.of(settings)
    t.create_tables(spark, warehouse)
    first = checkpoint(tmp_path / "cp-a", "query-a")
    writer = BatchWriter(warehouse, topics_of(settings), first, fold_on=fold_on)
    writer(kafka_batch(spark, settings), 0)
    after_first = versions(settings)

    # The same batch again: by the same writer, then by a restarted one (positions reloaded).
    writer(kafka_batch(spark, settings), 0)
    BatchWriter(warehouse, topics_of(settings), first, fold_on=fold_on)(
        kafka_batch(spark, settings), 0
    )
    assert versions(settings) == after_first

    # Batch 1 is cut after its stats MERGE; the restarted writer replays it.
    produce(
        settings,
        workload.log[half:],
        submits=workload.submits[4:],
        rejections=workload.rejections,
        aborted=workload.aborted,
        transactional=True,
    )
    with pytest.raises(RuntimeError, match="killed"):
        CrashBeforeJobs(warehouse, topics_of(settings), first, fold_on=fold_on)(
            kafka_batch(spark, settings), 1
        )
    cut = versions(settings)
    assert cut[t.JOBS] == after_first[t.JOBS]
    assert cut[t.STATS_PARTIAL] > after_first[t.STATS_PARTIAL]
    BatchWriter(warehouse, topics_of(settings), first, fold_on=fold_on)(
        kafka_batch(spark, settings), 1
    )
    done = versions(settings)
    assert done[t.STATS_PARTIAL] == cut[t.STATS_PARTIAL] and done[t.EVENTS] == cut[t.EVENTS]
    check_tables(settings, spark, workload)

    # Folded on the executors, the batch's large writes are Spark's (its files written by the
    # executors); folded on the driver, they are delta-rs's.
    for name in (t.EVENTS, t.JOBS):
        assert data_commit_engines(settings, name), name
        assert all(
            engine.startswith("Apache-Spark") == (fold_on == EXECUTORS)
            for engine in data_commit_engines(settings, name)
        ), (name, data_commit_engines(settings, name))

    # A new checkpoint (new app id, batch ids from 0) over the same data adds nothing.
    fresh = BatchWriter(
        warehouse, topics_of(settings), checkpoint(tmp_path / "cp-b", "query-b"), fold_on=fold_on
    )
    fresh(kafka_batch(spark, settings), 0)
    check_tables(settings, spark, workload)


def check_tables(settings: Settings, spark: SparkSession, workload: Any) -> None:
    rollup = StatsRollup(Warehouse.of(settings))
    rollup.run("test")
    assert not spark_rows(spark, settings, t.STATS_PARTIAL)
    rolled = versions(settings)[t.STATS]
    rollup.run("test")
    assert versions(settings)[t.STATS] == rolled, "a roll-up with nothing pending changed stats"
    assert jobs_of(spark_rows(spark, settings, t.JOBS)) == workload.expected_jobs()
    events = spark_rows(spark, settings, t.EVENTS)
    keys = Counter((row["topic"], row["partition"], row["offset"], row["idx"]) for row in events)
    assert max(keys.values()) == 1
    assert len(events) == len(workload.events()) + len(workload.submits) + len(workload.rejections)
    assert len(spark_rows(spark, settings, t.REJECTED)) == len(workload.rejections)
    admitted, _ = fence_events(workload.events())
    stats = spark_rows(spark, settings, t.STATS)
    assert sum(row["submitted"] for row in stats) == sum(
        isinstance(event, Enqueued) for event in admitted
    )
    assert sum(row["completed"] for row in stats) == sum(
        isinstance(event, Completed) for event in admitted
    )


@pytest.mark.parametrize(("min_records", "on_executors"), [(10**9, False), (1, True)])
def test_a_batch_below_the_executor_threshold_is_folded_on_the_driver(
    topics: Settings, spark: SparkSession, tmp_path: Path, min_records: int, on_executors: bool
) -> None:
    """`fold_on = auto` on a cluster: a batch of fewer records than
    `spark.executor_fold_min_records` is folded (and written) by the driver, a larger one by
    the executors (and Spark); the tables are the same either way."""
    settings = topics
    workload = mixed_workload()
    produce_workload(settings, workload)
    warehouse = Warehouse.of(settings)
    t.create_tables(spark, warehouse)
    writer = BatchWriter(
        warehouse,
        topics_of(settings),
        checkpoint(tmp_path / "cp", "query"),
        fold_on=EXECUTORS,
        executor_min_records=min_records,
    )
    writer(kafka_batch(spark, settings), 0)
    assert writer.last is not None and writer.last.on_executors is on_executors
    assert jobs_of(spark_rows(spark, settings, t.JOBS)) == workload.expected_jobs()
    for name in (t.EVENTS, t.JOBS):
        engines = data_commit_engines(settings, name)
        assert engines and all(e.startswith("Apache-Spark") is on_executors for e in engines)

"""The streaming application on real Kafka + Spark + Delta: the tables equal the leader."""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import (
    Assigned,
    Cancelled,
    Completed,
    DeadLettered,
    Enqueued,
    Reassigned,
    Redriven,
    Requeued,
)
from dispatch.core.fence import fence_events
from dispatch.delta import tables as t
from dispatch.delta.progress import latest_progress
from dispatch.event_records import encode_batch
from dispatch.settings import Settings
from dispatch.stack.broker import Broker, create_topics
from dispatch.storage import local_path
from dispatch.streaming.app import StreamOptions, checkpoint_dir, run, starting_offsets
from dispatch.warehouse import Warehouse
from tests.integration.streaming.conftest import (
    MixedRun,
    delta_rs_rows,
    dump,
    jobs_of,
    namespaced,
    produce,
    row_set,
    run_stream,
    spark_rows,
    with_warehouse,
)
from tests.unit.streaming.workload import CONFIG, GROUP, Driver, Workload, random_workload

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def test_jobs_equal_the_leaders_state_row_for_row(mixed_run: MixedRun, spark: SparkSession) -> None:
    expected = mixed_run.workload.expected_jobs()
    assert jobs_of(spark_rows(spark, mixed_run.settings, t.JOBS)) == expected
    assert jobs_of(delta_rs_rows(mixed_run.settings, t.JOBS)) == expected
    statuses = Counter(job["status"] for job in expected.values())
    assert statuses["succeeded"] and statuses["dead"] and statuses["queued"]


def test_spark_and_delta_rs_read_the_same_tables(mixed_run: MixedRun, spark: SparkSession) -> None:
    from deltalake import DeltaTable

    for name in t.SCHEMAS:
        by_spark = row_set(spark_rows(spark, mixed_run.settings, name))
        by_delta_rs = row_set(delta_rs_rows(mixed_run.settings, name))
        assert by_spark == by_delta_rs, name
        protocol = DeltaTable(Warehouse.of(mixed_run.settings).table(name)).protocol()
        # Plain protocol (1, 2): no table feature delta-rs could not read or write.
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), name


def test_events_hold_every_record_once_and_mark_the_fenced_ones(
    mixed_run: MixedRun, spark: SparkSession
) -> None:
    workload = mixed_run.workload
    rows = spark_rows(spark, mixed_run.settings, t.EVENTS)
    keys = Counter((row["topic"], row["partition"], row["offset"], row["idx"]) for row in rows)
    assert max(keys.values()) == 1, "duplicate rows in events"
    kinds = Counter(row["kind"] for row in rows)
    assert kinds["submit"] == len(workload.submits)
    assert kinds["rejected"] == len(workload.rejections)
    assert kinds["event"] == len(workload.events())  # the aborted transaction is not there
    admitted, _ = fence_events(workload.events())
    assert sum(1 for row in rows if row["kind"] == "event" and row["admitted"]) == len(admitted)
    void = [row for row in rows if row["kind"] == "event" and not row["admitted"]]
    assert void and {row["epoch"] for row in void} == {1}
    job_ids = {row["job_id"] for row in rows if row["kind"] == "event"}
    assert "job-aborted" not in job_ids and "job-zombie" in job_ids


def test_rejected_submissions_are_kept_with_their_reason(
    mixed_run: MixedRun, spark: SparkSession
) -> None:
    rows = sorted(spark_rows(spark, mixed_run.settings, t.REJECTED), key=lambda r: r["offset"])
    assert [row["job_id"] for row in rows[:2]] == ["bad-1", "bad-2"]
    assert rows[0]["value"] == b"{not json" and rows[0]["reason"] == "value: not JSON"
    assert rows[2]["reason"].startswith("undecodable rejection record")
    assert rows[2]["value"] == b"\xff not a rejection"


def test_the_dlq_is_the_leaders(mixed_run: MixedRun, spark: SparkSession) -> None:
    from dispatch.streaming.views import read_dlq, register_views

    expected = sorted(job.id for job in mixed_run.workload.leader.dead_letters())
    assert expected
    register_views(spark, Warehouse.of(mixed_run.settings))
    by_sql = sorted(row["id"] for row in spark.sql("SELECT id FROM dlq").collect())
    assert by_sql == expected
    assert sorted(record.id for record in read_dlq(Warehouse.of(mixed_run.settings))) == expected
    parts = spark.sql("SELECT part, count(*) AS n FROM jobs_all GROUP BY part").collect()
    counts = {row["part"]: row["n"] for row in parts}
    archived = len(spark_rows(spark, mixed_run.settings, t.JOBS_ARCHIVE))
    assert counts["archived"] == archived
    assert counts["open"] + counts["closed"] == len(mixed_run.workload.expected_jobs())


def test_statistics_count_every_admitted_event_once(
    mixed_run: MixedRun, spark: SparkSession
) -> None:
    admitted, _ = fence_events(mixed_run.workload.events())
    kinds = Counter(type(event) for event in admitted)
    retries = sum(
        1
        for event in admitted
        if isinstance(event, Reassigned) or (isinstance(event, Assigned) and event.attempt > 1)
    )
    rows = spark_rows(spark, mixed_run.settings, t.STATS)
    totals = Counter[str]()
    for row in rows:
        for name in (
            "submitted", "started", "retries", "completed", "requeued", "dead", "cancelled",
            "redriven", "queue_wait_n", "run_time_n",
        ):  # fmt: skip
            totals[name] += row[name]
    assert totals["submitted"] == kinds[Enqueued]
    assert totals["started"] == kinds[Assigned] + kinds[Reassigned]
    assert totals["retries"] == retries
    assert totals["completed"] == kinds[Completed] == totals["run_time_n"]
    assert totals["requeued"] == kinds[Requeued]
    assert totals["dead"] == kinds[DeadLettered]
    assert totals["cancelled"] == kinds[Cancelled]
    assert totals["redriven"] == kinds[Redriven]
    assert totals["queue_wait_n"] == kinds[Assigned]
    assert {row["exec"] for row in rows} >= {"image.resize", "text.index.full"}
    for row in rows:
        if row["run_time_n"]:
            assert row["run_time_min_s"] <= row["run_time_p50_s"] <= row["run_time_max_s"]


def test_percentiles_at_any_granularity_read_the_histograms(
    mixed_run: MixedRun, spark: SparkSession
) -> None:
    from dispatch.delta.stats import Histogram
    from dispatch.streaming.views import latency_percentiles

    frame = spark.read.format("delta").load(Warehouse.of(mixed_run.settings).table(t.STATS))
    by_spark = {row["exec"]: row.asDict() for row in latency_percentiles(frame, ["exec"]).collect()}
    expected: dict[str, Histogram] = {}
    for row in spark_rows(spark, mixed_run.settings, t.STATS):
        if row["run_time_n"]:
            expected.setdefault(row["exec"], Histogram()).merge(
                Histogram.from_columns(row, "run_time")
            )
    assert expected and set(by_spark) >= set(expected)
    for exec_name, histogram in expected.items():
        got = by_spark[exec_name]
        assert got["n"] == histogram.count
        for name, quantile in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            assert got[name] == pytest.approx(histogram.percentile(quantile)), (exec_name, name)


def test_pruned_lives_leave_jobs_for_the_archive(mixed_run: MixedRun, spark: SparkSession) -> None:
    archived = spark_rows(spark, mixed_run.settings, t.JOBS_ARCHIVE)
    assert archived and all(row["status"] in ("succeeded", "cancelled") for row in archived)
    live = {row["id"]: row for row in spark_rows(spark, mixed_run.settings, t.JOBS)}
    again = [row["id"] for row in archived if row["id"] in live]
    # The one pruned id submitted again lives on in jobs, as a new life.
    assert len(again) == 1 and live[again[0]]["client_id"] == "dave", dump(archived)


def test_each_jobs_commit_records_the_offsets_and_fence(mixed_run: MixedRun) -> None:
    committed = latest_progress(Warehouse.of(mixed_run.settings), t.JOBS)
    assert committed is not None
    progress = committed.progress
    kafka = mixed_run.settings.kafka
    assert progress.fence == {GROUP: 2}
    assert progress.topics["events"] == kafka.events_topic
    # Transactions add commit markers after the records: the position is past them.
    assert progress.offsets[kafka.events_topic][0] > mixed_run.committed_records
    assert sum(progress.offsets[kafka.submit_topic].values()) == len(mixed_run.workload.submits)
    assert sum(len(writer.history) for writer in mixed_run.writers) >= 2


def test_a_lost_checkpoint_resumes_from_the_tables(
    kafka_broker: Broker,
    stack_settings: Settings,
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A deleted checkpoint restarts from the offsets recorded in jobs, under a new app id:
    nothing is read twice, nothing is skipped."""
    settings = namespaced(stack_settings, tmp_path_factory.mktemp("lost"), "lost")
    create_topics(settings.kafka)
    workload = random_workload(7, steps=200)
    half = len(workload.log) // 2
    produce(settings, workload.log[:half], submits=workload.submits[:5])
    run_stream(settings, spark)
    first_app = latest_progress(Warehouse.of(settings), t.JOBS)
    shutil.rmtree(local_path(checkpoint_dir(settings).uri))
    assert starting_offsets(settings) != "earliest"
    produce(settings, workload.log[half:], submits=workload.submits[5:])
    run_stream(settings, spark)
    second_app = latest_progress(Warehouse.of(settings), t.JOBS)
    assert first_app is not None and second_app is not None
    assert first_app.progress.app_id != second_app.progress.app_id
    assert jobs_of(spark_rows(spark, settings, t.JOBS)) == workload.expected_jobs()
    events = spark_rows(spark, settings, t.EVENTS)
    assert len(events) == len(workload.events()) + len(workload.submits)
    # An uninterrupted run over the same topics writes the same statistics.
    reference = with_warehouse(settings, tmp_path_factory.mktemp("lost-reference"))
    run_stream(reference, spark)
    assert row_set(spark_rows(spark, settings, t.STATS)) == row_set(
        spark_rows(spark, reference, t.STATS)
    )


# --- poison records ---------------------------------------------------------------------------


def poisoned_log() -> tuple[Workload, list[bytes | None], dict[int, str]]:
    """Good leader records with poison between them, as a hostile producer writing straight to
    `dispatch.events` would place it; returns the workload (whose leader state `jobs` must
    equal), the values in log order, and the poison's index -> the words its reason names."""
    clock = [1_790_000_000.0]
    workload = Workload(leader=Dispatcher(CONFIG))
    driver = Driver(workload.leader, workload, clock)
    driver.do(lambda core, now: core.begin_epoch(1, now, holder="node-a"))
    driver.do(lambda core, now: core.join("w", ["job.assign.>"], now))
    for index in range(4):
        driver.submit(f"good-{index}", "image.resize", "alice")
    driver.credit("w", 2)
    for job_id in sorted(driver.running):
        driver.ack(job_id, {"ok": job_id})
    good = [record.value() for record in workload.log]
    overflow = Enqueued(
        epoch=1, at=clock[0], job_id="poison", client_id="alice", exec="image.resize",
        payload=None, max_attempts=2**31, timeout_s=30.0, seq=99,
    )  # fmt: skip
    ghost = Completed(epoch=1, at=clock[0], job_id="ghost", worker_id="w", attempt=1, lease="x")
    values: list[bytes | None] = [
        *good[:4],
        encode_batch(GROUP, 1, [overflow]),  # 2**31 does not fit jobs.max_attempts (int32)
        *good[4:7],
        b"\xff\xfe not JSON",
        None,  # a tombstone
        encode_batch(GROUP, 1, [ghost]),  # completes a job that does not exist
        *good[7:],
    ]
    poison = {4: "max_attempts", 8: "not JSON", 9: "tombstone", 10: "ghost"}
    return workload, values, poison


@pytest.mark.timeout(600)  # a Spark query run twice, five batches: slow on a busy machine
def test_poison_records_are_rejected_and_the_query_keeps_running(
    topics: Settings, spark: SparkSession
) -> None:
    """Issue 13 item 7: an events record the tables cannot hold (max_attempts 2**31), one that
    is not JSON, a tombstone and an event that fits no job, between good records: every batch
    commits, the good jobs reach `jobs`, each poison record lands in `rejected` with its
    reason; a run from a lost checkpoint adds nothing twice."""
    from kafka import KafkaProducer

    settings = topics
    workload, values, poison = poisoned_log()
    kafka = settings.kafka
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all", linger_ms=0)
    try:
        for value in values:
            producer.send(kafka.events_topic, key=GROUP.encode(), value=value)
        producer.flush()
    finally:
        producer.close()

    # Five records a batch: the poison sits in the middle batches, good records follow it.
    options = StreamOptions(max_offsets_per_trigger=5, rollup_every_s=0, maintenance=None)
    writer = run_stream(settings, spark, options)
    assert len(writer.history) >= 3
    assert jobs_of(spark_rows(spark, settings, t.JOBS)) == workload.expected_jobs()

    rejected = sorted(
        (
            row
            for row in spark_rows(spark, settings, t.REJECTED)
            if row["topic"] == kafka.events_topic
        ),
        key=lambda row: row["offset"],
    )
    assert [row["offset"] for row in rejected] == sorted(poison), dump(rejected)
    for row in rejected:
        assert poison[row["offset"]] in row["reason"], row["reason"]
        assert row["value"] == values[row["offset"]]
    events = spark_rows(spark, settings, t.EVENTS)
    flagged = {row["offset"] for row in events if row["error"] is not None}
    assert flagged == set(poison)

    # A lost checkpoint: the run restarts from what `jobs` covers and rejects nothing twice.
    shutil.rmtree(local_path(checkpoint_dir(settings, options).uri))
    run_stream(settings, spark, options)
    again = [row for row in spark_rows(spark, settings, t.REJECTED)]
    assert len(again) == len(poison)
    assert len(spark_rows(spark, settings, t.EVENTS)) == len(events)


def test_a_stop_asked_before_the_query_starts_starts_nothing(
    stack_settings: Settings, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A SIGTERM while the application's JVM starts (what `dispatch down` sends to a fold just
    launched): it returns at once, rather than start the query and wait out its first batch."""
    settings = namespaced(stack_settings, tmp_path_factory.mktemp("early-stop"), "early")
    stop = threading.Event()
    stop.set()
    assert run(settings, spark=spark, stop=stop) is None
    assert spark.streams.active == []
    assert not local_path(checkpoint_dir(settings).uri).exists()

"""The fold on real Kafka + Spark + Delta with the hard time limit and the cancel of a running
job: a time-limited job (requeued `time_limit`, then dead `time_limit`), running jobs
cancelled (`cancel_requested`, then `cancelled` with their worker: confirmed by the worker,
or at the end of the grace), and a queued job cancelled. `jobs` equals the leader's state
mid-way and at the end, the events keep who asked, and the statistics count each ending
once."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from dispatch.core.dispatcher import Dispatcher
from dispatch.delta import tables as t
from dispatch.delta.snapshot import latest_snapshot
from dispatch.settings import Settings
from dispatch.streaming.batch import DRIVER, EXECUTORS
from dispatch.streaming.views import register_views
from dispatch.warehouse import Warehouse
from tests.integration.streaming.conftest import (
    FAST,
    delta_rs_rows,
    jobs_of,
    produce,
    run_stream,
    spark_rows,
)
from tests.unit.streaming.workload import CONFIG, GROUP, Driver, Workload

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

LIMITED_CONFIG = dataclasses.replace(CONFIG, cancel_grace_s=5.0, max_attempts=2)


def first_part(driver: Driver) -> None:
    """Four jobs; three run (one with a 4 s limit), then two running ones and the queued
    one are cancelled."""
    driver.begin(1)
    driver.join("w1", "job.assign.>")
    driver.submit("limited", "video.encode", "alice", max_run_s=4.0)
    driver.submit("stopped", "image.resize", "alice")
    driver.submit("graced", "image.resize", "bob")
    driver.submit("waiting", "image.resize", "bob")
    driver.credit("w1", 3)
    driver.heartbeat("limited")  # its deadline stops at its time limit
    driver.do(
        lambda core, now: core.cancel("stopped", now, by="ops-key", reason="not needed any more")
    )
    driver.do(lambda core, now: core.cancel("graced", now))
    driver.do(lambda core, now: core.cancel("waiting", now, by="ops-key"))


def second_part(driver: Driver) -> None:
    """The worker confirms one cancel; the grace of the other and the time limit pass; the
    limited job's second (last) attempt reaches its limit too."""
    attempt, lease, _ = driver.running["stopped"]
    driver.do(
        lambda core, now: core.fail(
            "stopped", attempt, lease, now, error="cancelled: cancel_requested", retryable=False
        )
    )
    driver.tick(10.0)  # the grace (5 s) and the limit (4 s) have passed
    driver.credit("w1", 3)
    driver.tick(10.0)  # attempt 2 of `limited` reaches its limit: dead


@pytest.mark.timeout(900)
@pytest.mark.parametrize("fold_on", [DRIVER, EXECUTORS])
def test_time_limits_and_cancels_of_running_jobs_fold_into_the_tables(
    topics: Settings, spark: SparkSession, fold_on: str
) -> None:
    settings = topics
    options = dataclasses.replace(FAST, fold_on=fold_on)
    workload = Workload(leader=Dispatcher(LIMITED_CONFIG))
    driver = Driver(workload.leader, workload, [1_795_000_000.0])
    first_part(driver)
    produce(settings, workload.log)
    run_stream(settings, spark, options)

    # Mid-way: the limited job runs with its limit, the cancelled ones are `cancelling`.
    expected = workload.expected_jobs()
    jobs = jobs_of(spark_rows(spark, settings, t.JOBS))
    assert jobs == expected
    assert jobs["limited"]["max_run_s"] == 4.0
    assert jobs["limited"]["run_limit_at"] == pytest.approx(jobs["limited"]["deadline"])
    for job_id in ("stopped", "graced"):
        assert jobs[job_id]["status"] == "running"
        assert jobs[job_id]["cancel_requested_at"] is not None
    assert jobs["waiting"]["status"] == "cancelled"
    # A new leader rebuilds the cancel requests and the limits from `jobs`.
    snapshot = latest_snapshot(Warehouse.of(settings), GROUP)
    assert snapshot is not None
    assert {job.id: job.to_dict() for job in snapshot.jobs} == expected
    restored = Dispatcher.restore(snapshot.jobs, config=LIMITED_CONFIG, epoch=1)
    assert {job.id: job.to_dict() for job in restored.jobs()} == expected

    before = len(workload.log)
    second_part(driver)
    produce(settings, workload.log[before:])
    run_stream(settings, spark, options)

    expected = workload.expected_jobs()
    assert jobs_of(spark_rows(spark, settings, t.JOBS)) == expected
    assert jobs_of(delta_rs_rows(settings, t.JOBS)) == expected
    limited, stopped, graced = expected["limited"], expected["stopped"], expected["graced"]
    assert (limited["status"], limited["dead_reason"], limited["attempts"]) == (
        "dead",
        "time_limit",
        2,
    )
    assert "time limit" in limited["error"] and "run_limit_at" not in limited
    assert stopped["status"] == graced["status"] == "cancelled"
    assert "the worker stopped" in stopped["error"]
    assert "within the cancel grace" in graced["error"]
    for job in (stopped, graced):
        assert job["deadline"] is None and "cancel_requested_at" not in job

    # The events keep who asked and the worker an ending concerns.
    events = [row for row in spark_rows(spark, settings, t.EVENTS) if row["kind"] == "event"]
    types = Counter(row["type"] for row in events)
    assert types["cancel_requested"] == 2 and types["cancelled"] == 3
    asked = {
        row["job_id"]: (row["worker_id"], json.loads(row["body"]))
        for row in events
        if row["type"] == "cancel_requested"
    }
    assert asked["stopped"][0] == "w1"
    assert asked["stopped"][1]["by"] == "ops-key"
    assert asked["stopped"][1]["reason"] == "not needed any more"
    assert asked["graced"][1].get("by") is None
    ended = {row["job_id"]: row for row in events if row["type"] == "cancelled"}
    assert ended["stopped"]["worker_id"] == "w1" and ended["waiting"]["worker_id"] is None
    assert json.loads(ended["waiting"]["body"])["by"] == "ops-key"
    requeued = [json.loads(row["body"]) for row in events if row["type"] == "requeued"]
    assert [body["reason"] for body in requeued] == ["time_limit"]
    assert not [row for row in spark_rows(spark, settings, t.REJECTED)]

    # Each ending counted once: three cancels (two of running jobs), one death, one requeue.
    totals: Counter[str] = Counter()
    for row in spark_rows(spark, settings, t.STATS):
        for name in ("submitted", "started", "retries", "requeued", "dead", "cancelled"):
            totals[name] += row[name] or 0
    assert totals == Counter(submitted=4, started=4, retries=1, requeued=1, dead=1, cancelled=3)
    # The views (current jobs and their history) read the new columns.
    register_views(spark, Warehouse.of(settings))
    statuses = {
        row["id"]: (row["status"], row["max_run_s"])
        for row in spark.sql("SELECT id, status, max_run_s FROM jobs_all").collect()
    }
    assert statuses == {
        "limited": ("dead", 4.0),
        "stopped": ("cancelled", None),
        "graced": ("cancelled", None),
        "waiting": ("cancelled", None),
    }
    dlq = spark.sql("SELECT id, dead_reason FROM dlq").collect()
    assert [(row["id"], row["dead_reason"]) for row in dlq] == [("limited", "time_limit")]

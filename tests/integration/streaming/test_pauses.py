"""The fold on real Kafka + Spark + Delta with pauses and progress reports: an exec pattern
paused, resumed and paused again, a client paused, heartbeats with progress. The snapshot
holds exactly the leader's pauses (on the driver's fold and on the executors'), a restore
from it holds the paused queue, and `jobs` has the progress the leader has."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Assigned
from dispatch.delta import tables as t
from dispatch.delta.snapshot import latest_snapshot
from dispatch.settings import Settings
from dispatch.streaming.batch import DRIVER, EXECUTORS
from dispatch.warehouse import Warehouse
from tests.integration.streaming.conftest import (
    FAST,
    jobs_of,
    produce,
    replay_after,
    run_stream,
    spark_rows,
)
from tests.unit.streaming.test_pauses import pausing_workload
from tests.unit.streaming.workload import CONFIG, GROUP

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


@pytest.mark.timeout(900)
@pytest.mark.parametrize("fold_on", [DRIVER, EXECUTORS])
def test_pauses_survive_in_the_snapshot_and_progress_in_jobs(
    topics: Settings, spark: SparkSession, fold_on: str
) -> None:
    settings = topics
    options = dataclasses.replace(FAST, fold_on=fold_on)
    workload, after = pausing_workload()
    split = 9  # the exec pause and the client pause are in force, no resume yet
    produce(settings, workload.log[:split])
    run_stream(settings, spark, options)
    snapshot = latest_snapshot(Warehouse.of(settings), GROUP)
    assert snapshot is not None
    assert snapshot.pauses == after[split - 1] and len(snapshot.pauses) == 2

    produce(settings, workload.log[split:])
    # A new leader now: the snapshot's pauses, then the log after it (a resume of one of
    # them, a pause again), give the leader's pauses and jobs.
    rebuilt = replay_after(settings, snapshot)
    assert rebuilt.pauses() == workload.leader.pauses()
    assert {job.id: job.to_dict() for job in rebuilt.jobs()} == workload.expected_jobs()
    run_stream(settings, spark, options)
    expected = workload.expected_jobs()
    assert jobs_of(spark_rows(spark, settings, t.JOBS)) == expected
    assert expected["r1"]["progress"]["done"] == 3.0
    pauses = {(row["scope"], row["target"]): row for row in spark_rows(spark, settings, t.PAUSES)}
    assert set(pauses) == {("client", "bob"), ("exec", "image.>")}
    assert pauses["exec", "image.>"]["reason"] == "again"
    snapshot = latest_snapshot(Warehouse.of(settings), GROUP)
    assert snapshot is not None
    assert snapshot.pauses == workload.leader.pauses()

    restored = Dispatcher.restore(
        snapshot.jobs, config=CONFIG, epoch=snapshot.fence_epoch, pauses=snapshot.pauses
    )
    now = 1_796_000_000.0
    restored.resume(now)
    restored.join("w1", ["job.assign.>"], now)
    started = restored.grant_credit("w1", 5, now + 1)
    assert [event for event in started if isinstance(event, Assigned)] == []
    released = restored.unpause("exec", "image.>", now + 2)
    assert [event.job_id for event in released if isinstance(event, Assigned)] == ["r3"]

"""The fold on real Kafka + Spark + Delta with runtime limits and concurrency keys: limits on
a key pattern, an exec pattern and a client, one replaced with other knobs, one removed. The
snapshot holds exactly the leader's runtime limits (on the driver's fold and on the
executors'), a new leader rebuilt from it and the log after it has the leader's limits and
jobs, a restore from the final one holds what the limits hold, and `jobs` has each job's
key."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from dispatch.core.commands import SubmitRequest
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
from tests.unit.streaming.test_limits import limiting_workload
from tests.unit.streaming.workload import CONFIG, GROUP

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


@pytest.mark.timeout(900)
@pytest.mark.parametrize("fold_on", [DRIVER, EXECUTORS])
def test_limits_survive_in_the_snapshot_and_keys_in_jobs(
    topics: Settings, spark: SparkSession, fold_on: str
) -> None:
    settings = topics
    options = dataclasses.replace(FAST, fold_on=fold_on)
    workload, after = limiting_workload()
    split = 10  # the key, exec and client limits are in force; none replaced or removed yet
    produce(settings, workload.log[:split])
    run_stream(settings, spark, options)
    snapshot = latest_snapshot(Warehouse.of(settings), GROUP)
    assert snapshot is not None
    assert snapshot.limits == after[split - 1] and len(snapshot.limits) == 3

    produce(settings, workload.log[split:])
    # A new leader now: the snapshot's limits, then the log after it (a limit replaced, one
    # removed, one set), give the leader's limits and jobs.
    rebuilt = replay_after(settings, snapshot)
    assert rebuilt.limits() == workload.leader.limits()
    assert {job.id: job.to_dict() for job in rebuilt.jobs()} == workload.expected_jobs()
    run_stream(settings, spark, options)
    expected = workload.expected_jobs()
    assert jobs_of(spark_rows(spark, settings, t.JOBS)) == expected
    assert expected["a3"]["key"] == "account:2" and "key" not in expected["r1"]
    limits = {(row["scope"], row["target"]): row for row in spark_rows(spark, settings, t.LIMITS)}
    assert set(limits) == {("client", "bob"), ("exec", "image.*"), ("key", "account:2")}
    assert (limits["client", "bob"]["rate"], limits["client", "bob"]["burst"]) == (20.0, 40)
    assert limits["exec", "image.*"]["reason"] == "more gpus"
    snapshot = latest_snapshot(Warehouse.of(settings), GROUP)
    assert snapshot is not None
    assert snapshot.limits == workload.leader.limits()

    restored = Dispatcher.restore(
        snapshot.jobs, config=CONFIG, epoch=snapshot.fence_epoch, limits=snapshot.limits
    )
    now = 1_796_000_000.0
    restored.resume(now)
    restored.join("w1", ["job.assign.>"], now)
    restored.grant_credit("w1", 5, now)
    request = SubmitRequest(
        id="a4", exec="video.encode", payload=None, client_id="alice", key="account:2"
    )
    started = restored.submit(request, now + 1)
    assert [event for event in started if isinstance(event, Assigned)] == []
    released = restored.remove_limit("key", "account:2", now + 2)
    assert [event.job_id for event in released if isinstance(event, Assigned)] == ["a4"]

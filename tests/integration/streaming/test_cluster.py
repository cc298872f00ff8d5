"""The unchanged streaming application (`dispatch streaming`, its own process) on a Spark
standalone cluster: a master and two workers on loopback, the session's Kafka broker, a real
leader writing the log. The tables must equal the leader's state, and the master must show
the application with an executor on each worker.

The fold computes on the executors (streaming/executor_plan.py): the driver's REST API must
show the tasks of the batches' fold stages on both of them.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from deltalake.exceptions import TableNotFoundError

from dispatch.delta import tables as t
from dispatch.delta.snapshot import latest_snapshot
from dispatch.settings import Settings, to_environment
from dispatch.stack.local import DISPATCH
from dispatch.stack.ports import free_port
from dispatch.stack.process import ManagedProcess
from dispatch.streaming.app import QUERY_NAME
from dispatch.streaming.executor_plan import FOLD_JOB
from dispatch.warehouse import Warehouse
from tests.integration.api.conftest import short_timeouts
from tests.integration.streaming.conftest import delta_rs_rows, jobs_of, replay_after
from tests.integration.streaming.spark_cluster import HOST, SparkCluster, spark_cluster
from tests.integration.streaming.test_leader_e2e import drive_leader

pytestmark = pytest.mark.integration

EXECUTOR_MEMORY = "512m"
"""Half a worker's 1g: two executors, a driver, the broker and the test fit a small machine."""


def on_cluster(settings: Settings, master_url: str) -> Settings:
    """The same settings with the fold pointed at the cluster (what DISPATCH_SPARK__MASTER etc.
    do for `dispatch streaming`), and the driver's UI on for its REST API."""
    spark = settings.spark.model_copy(
        update={
            "master": master_url,
            "driver_host": HOST,
            "driver_bind_address": HOST,
            "executor_memory": EXECUTOR_MEMORY,
            # Every batch on the executors, however small (the test's batches are).
            "executor_fold_min_records": 0,
            "driver_memory": "1g",
            "ui_enabled": True,
            "ui_port": free_port(),
        }
    )
    return settings.model_copy(update={"spark": spark})


def _tables(settings: Settings) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The jobs (as the core's records) and rejected rows, read with delta-rs: the test needs
    no Spark of its own, all of Spark here is the application under test."""
    try:
        return jobs_of(delta_rs_rows(settings, t.JOBS)), delta_rs_rows(settings, t.REJECTED)
    except TableNotFoundError:
        return {}, []  # the application has not created its tables yet


def wait_for_tables(
    settings: Settings,
    expected: dict[str, dict[str, Any]],
    epoch: int,
    streaming: ManagedProcess,
    timeout_s: float = 240.0,
) -> None:
    """Until the running application has folded everything the leader logged (its first batch
    starts the executors' Python workers cold: ~30 s each on a busy 2-core machine)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert streaming.exit_code() is None, f"streaming exited:\n{streaming.log_tail(40)}"
        jobs, rejected = _tables(settings)
        snapshot = latest_snapshot(Warehouse.of(settings), settings.dispatcher.group)
        if jobs == expected and rejected and snapshot and snapshot.fence_epoch == epoch:
            return
        if time.monotonic() > deadline:
            assert jobs == expected, f"tables never matched:\n{streaming.log_tail(40)}"
            raise AssertionError(f"no rejection or snapshot:\n{streaming.log_tail(40)}")
        time.sleep(1.0)


def registered_app(cluster: SparkCluster, timeout_s: float = 30.0) -> dict[str, Any]:
    """The application's entry among the master's active applications."""
    deadline = time.monotonic() + timeout_s
    while True:
        active: list[dict[str, Any]] = cluster.master_state()["activeapps"]
        apps = [app for app in active if app["name"] == QUERY_NAME]
        if apps:
            [app] = apps
            return app
        assert time.monotonic() < deadline, f"not registered:\n{cluster.log_tails()}"
        time.sleep(0.5)


def fold_tasks_by_executor(settings: Settings) -> Counter[str]:
    """Successful tasks of the fold stages (the last stage of each job named FOLD_JOB), per
    executor id, from the driver's REST API."""
    base = f"http://{HOST}:{settings.spark.ui_port}/api/v1/applications"
    with httpx.Client(timeout=10.0) as http:
        (app,) = http.get(base).json()
        api = f"{base}/{app['id']}"
        tasks: Counter[str] = Counter()
        for job in http.get(f"{api}/jobs").json():
            if not str(job.get("description", "")).startswith(FOLD_JOB):
                continue
            stage = max(job["stageIds"])  # the result stage: the mapInArrow fold
            for attempt in http.get(f"{api}/stages/{stage}").json():
                listing = f"{api}/stages/{stage}/{attempt['attemptId']}/taskList?length=10000"
                for task in http.get(listing).json():
                    if task["status"] == "SUCCESS":
                        tasks[str(task["executorId"])] += 1
        return tasks


def executors_on_each_worker(
    cluster: SparkCluster, app_id: str, timeout_s: float = 30.0
) -> list[list[dict[str, Any]]]:
    deadline = time.monotonic() + timeout_s
    while True:
        executors = cluster.executors_by_worker(app_id)
        if all(executors):
            return executors
        assert time.monotonic() < deadline, f"executors per worker: {executors}"
        time.sleep(0.5)


def test_the_application_runs_on_a_standalone_cluster(topics: Settings, tmp_path: Path) -> None:
    leader_settings = short_timeouts(topics)
    with spark_cluster(tmp_path / "spark") as cluster:
        settings = on_cluster(leader_settings, cluster.master_url)
        streaming = ManagedProcess("streaming", tmp_path / "run", tmp_path / "streaming.log")
        # The application is started as the stack starts it: settings by environment only.
        environment = {**os.environ, **to_environment(settings), "SPARK_LOCAL_IP": HOST}
        try:
            streaming.start([DISPATCH, "streaming"], env=environment)
            # The leader runs while the application starts (both take a while on 2 cores).
            leader = drive_leader(leader_settings)
            expected = {job.id: job.to_dict() for job in leader.core.jobs()}
            wait_for_tables(settings, expected, leader.core.epoch, streaming)
            app = registered_app(cluster)
            executors = executors_on_each_worker(cluster, str(app["id"]))
            fold_tasks = fold_tasks_by_executor(settings)
        finally:
            streaming.stop(timeout_s=60.0)
        assert streaming.exit_code() == 0, streaming.log_tail(40)

        statuses = {job_id: job["status"] for job_id, job in expected.items()}
        assert statuses == {
            "d1": "dead", "ok1": "succeeded", "ok2": "succeeded", "f1": "succeeded",
            "c1": "succeeded", "c2": "cancelled",
        }  # fmt: skip
        jobs, [rejected] = _tables(settings)
        assert jobs == expected
        assert rejected["job_id"] == "bad" and rejected["value"] == b"{oops"
        snapshot = latest_snapshot(Warehouse.of(settings), settings.dispatcher.group)
        assert snapshot is not None and snapshot.fence_epoch == leader.core.epoch
        assert {job.id: job.to_dict() for job in replay_after(settings, snapshot).jobs()} == (
            expected
        )
        # One executor per worker, each with the configured heap (the master's view of it).
        assert [len(on_worker) for on_worker in executors] == [1, 1], executors
        assert all(on_worker[0]["memory"] == 512 for on_worker in executors), executors
        assert app["memoryperexecutor"] == 512, app
        # The fold ran on both executors (ids "0" and "1"; the driver runs no task here).
        assert set(fold_tasks) == {"0", "1"}, fold_tasks

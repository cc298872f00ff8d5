"""The fold with its warehouse and checkpoint on object storage (S3Proxy on loopback): the same
tables, the same snapshot for the leader's rebuild, the same views, read through `s3://` URIs
by Spark (S3A) and delta-rs alike."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from dispatch.delta import tables as t
from dispatch.delta.snapshot import latest_snapshot
from dispatch.settings import Settings
from dispatch.stack.broker import Broker, create_topics
from dispatch.streaming.app import checkpoint_dir
from dispatch.streaming.views import read_dlq, register_views
from dispatch.warehouse import Warehouse
from tests.integration.streaming.conftest import (
    delta_rs_rows,
    jobs_of,
    namespaced,
    produce,
    replay_after,
    run_stream,
    spark_rows,
)
from tests.s3_server import BUCKET, S3Server
from tests.unit.streaming.workload import GROUP, mixed_workload

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def on_object_store(settings: Settings, server: S3Server, prefix: str) -> Settings:
    """`settings` with the warehouse and the checkpoints under s3://BUCKET/prefix/."""
    paths = settings.paths.model_copy(
        update={
            "warehouse": server.uri(prefix, "delta"),
            "checkpoints": server.uri(prefix, "checkpoints"),
        }
    )
    return settings.model_copy(update={"paths": paths, "storage": server.settings()})


def test_the_fold_keeps_its_tables_and_checkpoint_on_object_storage(
    kafka_broker: Broker,
    stack_settings: Settings,
    spark: SparkSession,
    s3_server: S3Server,
    tmp_path: Path,
) -> None:
    local = namespaced(stack_settings, tmp_path, "object-store")
    settings = on_object_store(local, s3_server, "object-store")
    create_topics(settings.kafka)
    workload = mixed_workload(prune=True)
    half = len(workload.log) // 2
    produce(settings, workload.log[:half], submits=workload.submits)
    first = run_stream(settings, spark)
    # The checkpoint is objects in the bucket, nothing on local disk.
    checkpoint = s3_server.data / BUCKET / "object-store" / "checkpoints" / "streaming"
    assert (checkpoint / "metadata").is_file() and list((checkpoint / "offsets").iterdir())
    assert checkpoint_dir(settings).uri.startswith("s3://")
    assert not (local.paths.var / "checkpoints").exists()
    assert first.has_app_id and first.history

    # The leader's rebuild: the snapshot read from the bucket plus the log after it.
    warehouse = Warehouse.of(settings)
    snapshot = latest_snapshot(warehouse, GROUP)
    assert snapshot is not None and snapshot.jobs

    # The second run resumes from the checkpoint in the bucket: nothing folded twice.
    produce(settings, workload.log[half:], aborted=workload.aborted, transactional=True)
    second = run_stream(settings, spark)
    assert second.app_id == first.app_id
    expected = workload.expected_jobs()
    assert jobs_of(delta_rs_rows(settings, t.JOBS)) == expected
    assert jobs_of(spark_rows(spark, settings, t.JOBS)) == expected
    events = spark_rows(spark, settings, t.EVENTS)
    keys = {(row["topic"], row["partition"], row["offset"], row["idx"]) for row in events}
    assert len(keys) == len(events)
    leader = replay_after(settings, snapshot)
    assert {job.id: job.to_dict() for job in leader.jobs()} == expected

    # Notebooks' views and the API's delta-rs reads see the same tables.
    register_views(spark, warehouse)
    dead = {job.id for job in read_dlq(warehouse, GROUP)}
    assert dead == {job_id for job_id, job in expected.items() if job["status"] == "dead"}
    assert spark.sql("SELECT count(*) AS n FROM dlq").collect()[0]["n"] == len(dead)

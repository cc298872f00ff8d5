"""OPTIMIZE and VACUUM keep every table's content (and the snapshot pointer) unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from dispatch.delta import tables as t
from dispatch.delta.snapshot import latest_snapshot
from dispatch.settings import Settings
from dispatch.streaming.maintenance import Maintenance, MaintenancePolicy
from dispatch.warehouse import Warehouse
from tests.integration.streaming.conftest import (
    delta_rs_rows,
    jobs_of,
    produce,
    row_set,
    run_stream,
    spark_rows,
)
from tests.unit.streaming.workload import GROUP, random_workload

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def file_count(settings: Settings, name: str) -> int:
    from deltalake import DeltaTable

    return len(DeltaTable(Warehouse.of(settings).table(name)).file_uris())


def open_jobs_files(settings: Settings) -> list[str]:
    table = Warehouse.of(settings).open(t.JOBS)
    return sorted(table.file_uris(file_pruning_predicate=[("part", "=", "open")]))


def test_compaction_and_vacuum_change_no_row(topics: Settings, spark: SparkSession) -> None:
    settings = topics
    workload = random_workload(3, steps=250)
    third = len(workload.log) // 3
    for part in (workload.log[:third], workload.log[third : 2 * third], workload.log[2 * third :]):
        produce(settings, part)
        run_stream(settings, spark)
    before = {name: row_set(spark_rows(spark, settings, name)) for name in t.SCHEMAS}
    snapshot = latest_snapshot(Warehouse.of(settings), GROUP)
    files = sum(file_count(settings, name) for name in t.SCHEMAS)
    open_files = open_jobs_files(settings)
    maintenance = Maintenance(Warehouse.of(settings), MaintenancePolicy(vacuum_retain_hours=0))
    maintenance.optimize()
    maintenance.vacuum(spark)
    assert sum(file_count(settings, name) for name in t.SCHEMAS) < files
    # The open partition of jobs keeps the files the MERGEs wrote (docs/streaming.md).
    assert open_jobs_files(settings) == open_files
    for name in t.SCHEMAS:
        assert row_set(spark_rows(spark, settings, name)) == before[name], name
        assert row_set(delta_rs_rows(settings, name)) == before[name], name
    after = latest_snapshot(Warehouse.of(settings), GROUP)
    assert after is not None and snapshot is not None
    # Maintenance commits carry no progress: the pointer still names the last batch.
    assert (after.version, after.offsets) == (snapshot.version, snapshot.offsets)
    assert jobs_of(spark_rows(spark, settings, t.JOBS)) == workload.expected_jobs()

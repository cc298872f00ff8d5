"""kill -9 of the streaming driver in the middle of a batch, then a restart: the tables are
those of an uninterrupted run (no duplicate events, no double-counted statistics)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from dispatch.delta import tables as t
from dispatch.delta.progress import latest_progress
from dispatch.settings import PROJECT_ROOT, Settings, to_environment
from dispatch.streaming.app import StreamOptions
from dispatch.warehouse import Warehouse
from tests.integration.streaming.conftest import (
    jobs_of,
    produce_workload,
    row_set,
    run_stream,
    spark_rows,
    with_warehouse,
)
from tests.unit.streaming.workload import mixed_workload

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

MAX_OFFSETS = 45
"""Two batches: the kill lands in the first, the restart replays it and runs the second."""


def start_driver(settings: Settings, log_file: Path) -> subprocess.Popen[bytes]:
    environment = {**os.environ, **to_environment(settings)}
    argv = [
        sys.executable, "-m", "dispatch.streaming.app", "--no-maintenance", "--rollup-every-s", "0",
        "--max-offsets-per-trigger", str(MAX_OFFSETS),
    ]  # fmt: skip
    with log_file.open("ab") as log:
        # A session of its own: the kill reaches the Python driver and its JVM together.
        return subprocess.Popen(
            argv, cwd=PROJECT_ROOT, env=environment, stdout=log, stderr=log, start_new_session=True
        )


def kill_mid_batch(driver: subprocess.Popen[bytes], settings: Settings, log_file: Path) -> int:
    """SIGKILL the driver as soon as a batch has committed `events` but not yet `jobs`;
    returns that batch's id."""
    warehouse = Warehouse.of(settings)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            if driver.poll() is not None:
                pytest.fail(f"the driver exited early:\n{log_file.read_text()[-3000:]}")
            events = latest_progress(warehouse, t.EVENTS)
            if events is not None:
                jobs = latest_progress(warehouse, t.JOBS)
                if jobs is None or jobs.progress.batch_id < events.progress.batch_id:
                    os.killpg(driver.pid, signal.SIGKILL)
                    return events.progress.batch_id
            time.sleep(0.02)
        pytest.fail(f"no batch was caught between its writes:\n{log_file.read_text()[-3000:]}")
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)


def test_kill_9_mid_batch_then_restart_equals_an_uninterrupted_run(
    topics: Settings, spark: SparkSession, tmp_path: Path
) -> None:
    settings = topics
    workload = mixed_workload(prune=True)
    produce_workload(settings, workload)
    log_file = tmp_path / "driver.log"
    killed_in = kill_mid_batch(start_driver(settings, log_file), settings, log_file)
    jobs_before = latest_progress(Warehouse.of(settings), t.JOBS)
    assert jobs_before is None or jobs_before.progress.batch_id < killed_in

    # The restart resumes from the same checkpoint: it replays the cut batch (same offsets,
    # from the offset log), then the rest. It runs in this process, whose JVM is warm.
    options = StreamOptions(max_offsets_per_trigger=MAX_OFFSETS, rollup_every_s=0, maintenance=None)
    run_stream(settings, spark, options)
    reference = with_warehouse(settings, tmp_path / "reference")
    run_stream(reference, spark, options)
    assert jobs_of(spark_rows(spark, settings, t.JOBS)) == workload.expected_jobs()
    for name in t.SCHEMAS:
        got = row_set(spark_rows(spark, settings, name), drop=("batch_id",))
        want = row_set(spark_rows(spark, reference, name), drop=("batch_id",))
        assert got == want, name

"""The snapshot pointer: `jobs` at the recorded version + the log after its offsets = the
leader, read with delta-rs (no JVM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch.delta import tables as t
from dispatch.delta.progress import latest_progress
from dispatch.delta.snapshot import latest_snapshot
from dispatch.warehouse import Warehouse
from tests.integration.streaming.conftest import MixedRun, replay_after
from tests.unit.streaming.workload import GROUP

pytestmark = pytest.mark.integration


def test_the_latest_snapshot_plus_the_tail_is_the_leader(mixed_run: MixedRun) -> None:
    snapshot = latest_snapshot(Warehouse.of(mixed_run.settings), GROUP)
    assert snapshot is not None
    committed = latest_progress(Warehouse.of(mixed_run.settings), t.JOBS)
    assert committed is not None and snapshot.version == committed.version
    assert snapshot.fence_epoch == 2
    assert snapshot.events_topic == mixed_run.settings.kafka.events_topic
    assert snapshot.offsets == committed.progress.offsets[snapshot.events_topic]
    expected = mixed_run.workload.expected_jobs()
    assert {job.id: job.to_dict() for job in snapshot.jobs} == expected
    leader = replay_after(mixed_run.settings, snapshot)
    assert {job.id: job.to_dict() for job in leader.jobs()} == expected


def test_an_older_snapshot_plus_a_longer_tail_is_the_leader_too(mixed_run: MixedRun) -> None:
    older = mixed_run.first_snapshot
    assert older.fence_epoch == 1 and older.jobs
    leader = replay_after(mixed_run.settings, older)
    assert {job.id: job.to_dict() for job in leader.jobs()} == (mixed_run.workload.expected_jobs())
    assert leader.epoch == 2


def test_no_snapshot_before_the_first_batch(tmp_path: Path) -> None:
    assert latest_snapshot(Warehouse.at(tmp_path), GROUP) is None

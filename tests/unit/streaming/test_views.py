"""delta-rs readers of the DLQ and of one job (the Spark views run in the integration tests)."""

from __future__ import annotations

from pathlib import Path

from dispatch.core.job import DeadReason, JobStatus
from dispatch.streaming.views import VIEWS, read_dlq, read_job
from dispatch.warehouse import Warehouse
from tests.unit.delta.test_snapshot import commit, record


def test_the_dlq_and_single_jobs(tmp_path: Path) -> None:
    dead_late, dead_early = (
        record("dead-late", JobStatus.DEAD),
        record("dead-early", JobStatus.DEAD),
    )
    for job, updated in ((dead_late, 9.0), (dead_early, 3.0)):
        job.dead_reason = DeadReason.ACK_TIMEOUT
        job.attempts = 3
        job.updated_at = updated
    commit(
        tmp_path, [record("q"), dead_late, dead_early, record("s", JobStatus.SUCCEEDED)], "g", None
    )
    warehouse = Warehouse.at(tmp_path)
    assert [job.id for job in read_dlq(warehouse)] == ["dead-early", "dead-late"]
    assert [job.id for job in read_dlq(warehouse, "other")] == []
    found = read_job(warehouse, "s")
    assert found is not None and found.status is JobStatus.SUCCEEDED
    assert read_job(warehouse, "s", "other") is None and read_job(warehouse, "nope") is None
    assert "status = 'dead'" in VIEWS["dlq"]

"""JobRecord: the Delta row format, its validation and its copy."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatch.core import DeadReason, JobRecord, JobStatus

REQUIRED = {
    "id",
    "client_id",
    "exec",
    "payload",
    "status",
    "attempts",
    "max_attempts",
    "timeout_s",
    "priority",
    "not_before",
    "worker_id",
    "lease",
    "deadline",
    "submitted_at",
    "updated_at",
    "result",
    "error",
    "dead_reason",
}


def running_record() -> JobRecord:
    return JobRecord(
        id="j1",
        client_id="acme",
        exec="image.resize",
        payload={"url": "s3://x"},
        max_attempts=3,
        timeout_s=30.0,
        submitted_at=100.0,
        updated_at=101.0,
        seq=4,
        status=JobStatus.RUNNING,
        attempts=2,
        worker_id="w1",
        lease="1.9",
        deadline=161.0,
        error="earlier failure",
    )


def test_to_dict_has_every_column_the_team_agreed_on_and_is_json() -> None:
    data = running_record().to_dict()
    assert set(data) >= REQUIRED and data["status"] == "running"
    assert JobRecord.from_dict(json.loads(json.dumps(data))) == running_record()


def test_dead_reason_round_trips_as_a_string() -> None:
    record = running_record()
    record.status, record.deadline, record.dead_reason = (
        JobStatus.DEAD,
        None,
        DeadReason.ACK_TIMEOUT,
    )
    data = record.to_dict()
    assert data["dead_reason"] == "ack_timeout"
    assert JobRecord.from_dict(data).dead_reason is DeadReason.ACK_TIMEOUT


def _with(**changes: Any) -> dict[str, Any]:
    data = running_record().to_dict()
    data.update(changes)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_with(status="lost"), r"job\.status"),
        (_with(attempts=-1), r"job\.attempts"),
        (_with(attempts=4), r"attempts: 4 exceeds max_attempts 3"),
        (_with(lease=None), r"lease: required while running"),
        (_with(status="queued"), r"deadline: only a running job has one"),
        (_with(status="queued", deadline=None), r"worker_id: a queued job has no worker"),
        (_with(status="dead", deadline=None), r"dead_reason: set exactly when the job is dead"),
        (_with(exec="a..b"), r"job\.exec"),
        (_with(priority=10**9), r"job\.priority"),
        (_with(color="red"), r"unknown field"),
        ({k: v for k, v in _with().items() if k != "seq"}, r"job\.seq: missing"),
    ],
)
def test_from_dict_names_the_bad_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobRecord.from_dict(data)


def test_copy_is_independent() -> None:
    record = running_record()
    copy = record.copy()
    assert copy == record and copy is not record
    copy.attempts = 3
    assert record.attempts == 2


def test_terminal_statuses() -> None:
    record = running_record()
    assert not record.is_terminal
    for status in (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED):
        record.status = status
        assert record.is_terminal

"""Progress reports: carried by job heartbeats, kept on the record, one a second per job."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatch.core import (
    JobHeartbeat,
    JobRecord,
    JobStatus,
    RejectCode,
    Rejected,
    event_from_dict,
)
from dispatch.core.progress import MAX_PROGRESS_MESSAGE, PROGRESS_EVERY_S
from tests.unit.core.helpers import T0, Run, ack, assignments, request, worker


def _beat(run: Run, now: float, progress: Any, job_id: str = "j1") -> list[Any]:
    job = run.job(job_id)
    assert job.lease is not None
    return run(run.core.heartbeat(job_id, job.attempts, job.lease, now, progress=progress))


def test_a_report_is_kept_on_the_record_with_its_time() -> None:
    run = Run()
    run.start()
    (event,) = _beat(run, T0 + 2, {"done": 3, "total": 10, "message": "resizing"})
    assert isinstance(event, JobHeartbeat)
    assert event.progress == {"done": 3.0, "total": 10.0, "message": "resizing"}
    assert run.job().progress == {"done": 3.0, "total": 10.0, "message": "resizing", "at": T0 + 2}
    # Fields left out are null; a heartbeat without a report keeps the last one.
    _beat(run, T0 + 4, {"done": 4})
    _beat(run, T0 + 6, None)
    assert run.job().progress == {"done": 4.0, "total": None, "message": None, "at": T0 + 4}
    run.check()


def test_a_report_sooner_than_a_second_after_the_last_kept_is_dropped() -> None:
    run = Run()
    run.start()
    _beat(run, T0 + 1, {"done": 1})
    deadline = run.job().deadline
    (event,) = _beat(run, T0 + 1 + PROGRESS_EVERY_S / 2, {"done": 2})
    # The heartbeat applies (the deadline moves), the report does not.
    assert isinstance(event, JobHeartbeat) and event.progress is None
    assert deadline is not None and event.deadline > deadline
    assert run.job().progress == {"done": 1.0, "total": None, "message": None, "at": T0 + 1}
    assert "progress" not in event.to_dict()
    # Measured from the last report kept, not the last one sent: one second on, it is kept.
    (event,) = _beat(run, T0 + 1 + PROGRESS_EVERY_S, {"done": 3})
    assert event.progress is not None and run.job().progress["done"] == 3.0  # type: ignore[index]
    run.check()


@pytest.mark.parametrize(
    ("progress", "field"),
    [
        ({"done": -1}, "progress.done"),
        ({"done": "3"}, "progress.done"),
        ({"total": 3}, "progress.done"),
        ({"done": 1, "total": -2}, "progress.total"),
        ({"done": 1, "message": "x" * (MAX_PROGRESS_MESSAGE + 1)}, "progress.message"),
        ({"done": 1, "message": 7}, "progress.message"),
        ({"done": 1, "percent": 5}, "progress: unknown field(s) ['percent']"),
        ([1, 2], "progress: expected a JSON object"),
        ("half", "progress: expected a JSON object"),
    ],
)
def test_an_invalid_report_is_refused_naming_the_field(progress: Any, field: str) -> None:
    run = Run()
    run.start()
    before = run.job().to_dict()
    with pytest.raises(Rejected) as caught:
        _beat(run, T0 + 2, progress)
    assert caught.value.code is RejectCode.INVALID and field in caught.value.detail
    assert caught.value.job_id == "j1"
    assert run.job().to_dict() == before, "a refused heartbeat changes nothing"


def test_a_message_of_the_longest_length_is_kept() -> None:
    run = Run()
    run.start()
    _beat(run, T0 + 2, {"done": 0, "message": "x" * MAX_PROGRESS_MESSAGE})
    assert run.job().progress is not None


def test_a_requeue_clears_the_report() -> None:
    run = Run()
    assigned = run.start()
    _beat(run, T0 + 2, {"done": 5})
    run(run.core.fail("j1", 1, assigned.lease, T0 + 3, error="flaky", retryable=True))
    job = run.job()
    # Requeued (its worker has no credit left for the next attempt).
    assert job.status is JobStatus.QUEUED and job.progress is None
    run.check()


def test_a_reassignment_clears_the_report() -> None:
    run = Run(ack_timeout_s=10.0)
    run.start()
    _beat(run, T0 + 2, {"done": 5})
    run(worker(run.core, "w2", credits=1, now=T0 + 3))
    events = run(run.core.tick(T0 + 13))
    (reassigned,) = assignments(events)
    assert reassigned.type == "reassigned" and reassigned.worker_id == "w2"
    assert run.job().progress is None
    # The new attempt's first report is kept, however soon after the old attempt's.
    _beat(run, T0 + 13, {"done": 1})
    assert run.job().progress is not None and run.job().progress["at"] == T0 + 13  # type: ignore[index]
    run.check()


def test_kept_when_the_job_ends_and_cleared_by_a_redrive() -> None:
    run = Run()
    assigned = run.start("j1")
    _beat(run, T0 + 2, {"done": 9, "total": 10})
    run(ack(run.core, assigned, T0 + 3, result="ok"))
    assert run.job("j1").status is JobStatus.SUCCEEDED
    assert run.job("j1").progress == {"done": 9.0, "total": 10.0, "message": None, "at": T0 + 2}

    run(run.core.grant_credit("w", 1, T0 + 4))
    second = run.start("j2", max_attempts=1)
    _beat(run, T0 + 5, {"done": 1}, "j2")
    run(run.core.fail("j2", 1, second.lease, T0 + 6, error="bad", retryable=False))
    assert run.job("j2").status is JobStatus.DEAD and run.job("j2").progress is not None
    run(run.core.redrive("j2", T0 + 7))
    assert run.job("j2").progress is None
    run.check()


def test_the_record_round_trips_with_its_report() -> None:
    run = Run()
    run.start()
    _beat(run, T0 + 2, {"done": 2.5, "total": 4, "message": "half"})
    data = json.loads(json.dumps(run.job().to_dict()))
    assert data["progress"] == {"done": 2.5, "total": 4.0, "message": "half", "at": T0 + 2}
    assert JobRecord.from_dict(data).to_dict() == run.job().to_dict()
    # Unset, the field is left out, as before it existed.
    run(run.core.submit(request("j9"), T0))
    assert "progress" not in run.job("j9").to_dict()


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ({"done": 1.0}, r"job\.progress\.at: missing required field"),
        ({"done": 1.0, "at": 1.0, "extra": 1}, r"job\.progress: unknown field"),
        ({"done": -1.0, "at": 1.0}, r"job\.progress\.done"),
        ("50%", r"job\.progress: expected a JSON object"),
    ],
)
def test_a_bad_stored_report_is_refused(stored: Any, message: str) -> None:
    run = Run()
    run.start()
    data = run.job().to_dict()
    data["progress"] = stored
    with pytest.raises(ValueError, match=message):
        JobRecord.from_dict(data)


def test_the_heartbeat_event_round_trips_with_its_report() -> None:
    run = Run()
    run.start()
    (event,) = _beat(run, T0 + 2, {"done": 1, "message": "go"})
    data = json.loads(json.dumps(event.to_dict()))
    assert data["progress"] == {"done": 1.0, "total": None, "message": "go"}
    assert event_from_dict(data) == event
    data["progress"] = {"done": -1}
    with pytest.raises(ValueError, match=r"job_heartbeat\.progress\.done"):
        event_from_dict(data)
    data["progress"] = None
    assert event_from_dict(data).progress is None  # type: ignore[attr-defined]


def test_replay_and_the_per_job_fold_give_the_same_records() -> None:
    run = Run(ack_timeout_s=10.0)
    first = run.start("j1")
    for n in range(6):
        _beat(run, T0 + 0.4 * n, {"done": n, "total": 5})
    run(run.core.fail("j1", 1, first.lease, T0 + 3, error="again"))
    run(run.core.grant_credit("w", 1, T0 + 3))
    _beat(run, T0 + 3.5, {"done": 1, "message": "second attempt"})
    run.check()

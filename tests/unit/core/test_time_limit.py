"""The hard time limit (`max_run_s`): no attempt runs past it, heartbeats or not; reaching it
is a failed attempt (`time_limit`), retried after its policy's delay or dead-lettered."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from dispatch.core import (
    Assigned,
    DeadLettered,
    Dispatcher,
    Enqueued,
    JobRecord,
    JobStatus,
    Reassigned,
    Requeued,
    RetryPolicy,
    SubmitRequest,
    check_invariants,
    fold_job_events,
)
from dispatch.core.config import CoreConfig
from dispatch.core.job import DeadReason, RequeueReason, check_record
from tests.unit.core import helpers
from tests.unit.core.helpers import T0, assignments, make, request, types, worker


class Run(helpers.Run):
    defaults: ClassVar[Mapping[str, Any]] = {"ack_timeout_s": 30.0}
    credits = 5


@pytest.mark.parametrize(("max_run_s", "deadline"), [(10.0, T0 + 10), (50.0, T0 + 30)])
def test_the_first_deadline_is_the_shorter_of_the_timeout_and_the_limit(
    max_run_s: float, deadline: float
) -> None:
    run = Run()
    assigned = run.start(max_run_s=max_run_s)
    assert assigned.deadline == deadline
    job = run.job()
    assert job.max_run_s == max_run_s and job.run_limit_at == T0 + max_run_s
    run.check()


def test_a_job_without_a_limit_has_no_run_limit() -> None:
    run = Run()
    run.start()
    job = run.job()
    assert (job.max_run_s, job.run_limit_at) == (None, None)
    assert "max_run_s" not in job.to_dict() and "run_limit_at" not in job.to_dict()


def test_heartbeats_never_carry_the_deadline_past_the_limit() -> None:
    run = Run()
    assigned = run.start(max_run_s=50.0)
    deadlines = []
    for at in (T0 + 10, T0 + 25, T0 + 45):
        (beat,) = run(run.core.heartbeat("j1", 1, assigned.lease, at))
        deadlines.append(beat.deadline)  # type: ignore[attr-defined]
    assert deadlines == [T0 + 40, T0 + 50, T0 + 50]
    assert run.core.tick(T0 + 49.9) == []
    run.check()


def test_reaching_the_limit_requeues_the_job_after_its_retry_delay() -> None:
    run = Run(retry=RetryPolicy(delay_s=7.0))
    assigned = run.start(max_run_s=50.0, credits=1)
    run(run.core.heartbeat("j1", 1, assigned.lease, T0 + 40))
    (requeued,) = run(run.core.tick(T0 + 50))
    assert isinstance(requeued, Requeued) and requeued.reason is RequeueReason.TIME_LIMIT
    assert (requeued.worker_id, requeued.attempt) == ("w", 1)
    assert requeued.not_before == T0 + 57, "the policy's delay, as after a failure"
    assert requeued.error is not None and "time limit of 50s" in requeued.error
    job = run.job()
    assert job.status is JobStatus.QUEUED and job.run_limit_at is None and job.deadline is None
    worker_record = run.core.worker("w")
    assert worker_record is not None and worker_record.running == ()
    # The worker's timed-out slot is gone: a grant lets it take the retry when it is due.
    run(run.core.grant_credit("w", 1, T0 + 51))
    assert run.core.tick(T0 + 56) == []
    (again,) = assignments(run(run.core.tick(T0 + 57)))
    assert again.attempt == 2 and again.deadline == T0 + 57 + 50  # backoff 30 x 2 = 60 > 50
    assert run.job().run_limit_at == T0 + 107
    run.check()


def test_the_limit_without_a_retry_delay_still_requeues_instead_of_reassigning() -> None:
    run = Run()
    run(worker(run.core, "w2", credits=5))
    run.start(max_run_s=10.0)
    events = run(run.core.tick(T0 + 10))
    assert isinstance(events[0], Requeued) and events[0].reason is RequeueReason.TIME_LIMIT
    assert events[0].not_before is None
    (again,) = assignments(events)
    assert isinstance(again, Assigned) and again.attempt == 2
    run.check()


def test_the_last_attempt_reaching_the_limit_is_dead_lettered() -> None:
    run = Run()
    run.start(max_run_s=5.0, max_attempts=1)
    (dead,) = run(run.core.tick(T0 + 5))
    assert isinstance(dead, DeadLettered) and dead.reason is DeadReason.TIME_LIMIT
    job = run.job()
    assert job.status is JobStatus.DEAD and job.dead_reason is DeadReason.TIME_LIMIT
    assert job.run_limit_at is None
    run.check()


def test_a_timeout_before_the_limit_is_an_ordinary_timeout_even_seen_late() -> None:
    """The deadline (30 s) came before the limit (100 s): the attempt timed out. A tick that
    runs only after the limit (a leader busy elsewhere) decides the same."""
    run = Run()
    run(worker(run.core, "w2", credits=5))
    run.start(max_run_s=100.0)
    events = run(run.core.tick(T0 + 150))
    (reassigned,) = assignments(events)
    assert isinstance(reassigned, Reassigned) and reassigned.worker_id == "w2"
    assert reassigned.deadline == T0 + 150 + 60 and run.job().run_limit_at == T0 + 250
    run.check()


def test_a_reassignment_gets_the_shorter_of_its_backoff_and_the_limit() -> None:
    run = Run()
    run(worker(run.core, "w2", credits=5))
    run.start(max_run_s=45.0)
    (reassigned,) = assignments(run(run.core.tick(T0 + 30)))
    assert reassigned.attempt == 2 and reassigned.deadline == T0 + 30 + 45
    run.check()


def test_an_ack_in_time_completes_and_clears_the_limit() -> None:
    run = Run()
    assigned = run.start(max_run_s=50.0)
    run(run.core.ack("j1", 1, assigned.lease, T0 + 49))
    job = run.job()
    assert job.status is JobStatus.SUCCEEDED and job.run_limit_at is None
    assert job.max_run_s == 50.0, "the job keeps its limit"
    run.check()


def test_a_cancel_requested_before_the_limit_ends_cancelled_at_its_grace() -> None:
    run = Run(cancel_grace_s=20.0)
    run.start(max_run_s=10.0)
    (requested,) = run(run.core.cancel("j1", T0 + 5))
    assert requested.deadline == T0 + 10  # type: ignore[attr-defined]
    assert types(run(run.core.tick(T0 + 10))) == ["cancelled"]
    run.check()


# --- defaults ---------------------------------------------------------------------------------


def test_the_limit_is_the_jobs_own_else_its_execs_else_the_global_default() -> None:
    config = CoreConfig(
        max_run_s=300.0,
        max_run_by_exec=(("video.>", 3600.0), ("image.thumb", 5.0)),
        worker_expiry_s=None,
    )
    core = Dispatcher(config)
    assert config.max_run_for("video.encode.hd") == 3600.0
    assert config.max_run_for("image.thumb") == 5.0
    assert config.max_run_for("image.resize") == 300.0
    assert CoreConfig().max_run_for("image.resize") is None

    def enqueued(job_id: str, exec_name: str, **fields: Any) -> Enqueued:
        event = core.submit(request(job_id, exec_name, **fields), T0)[0]
        assert isinstance(event, Enqueued)
        return event

    assert enqueued("a", "video.encode.hd").max_run_s == 3600.0
    assert enqueued("b", "image.thumb").max_run_s == 5.0
    assert enqueued("c", "image.resize").max_run_s == 300.0
    assert enqueued("d", "image.thumb", max_run_s=9).max_run_s == 9.0
    # Decided at enqueue: the event carries it, so a replay under another config agrees.
    replica = Dispatcher(CoreConfig())
    replica.apply_all(event for event in core.submit(request("e", "image.thumb"), T0))
    assert replica.job("e").max_run_s == 5.0  # type: ignore[union-attr]


def test_no_limit_anywhere_leaves_it_out_of_the_event() -> None:
    (event,) = make().submit(request("a"), T0)
    assert isinstance(event, Enqueued) and event.max_run_s is None
    assert "max_run_s" not in event.to_dict()


@pytest.mark.parametrize(
    "config",
    [
        {"max_run_s": 0},
        {"max_run_s": -1.0},
        {"max_run_by_exec": (("a..b", 5.0),)},
        {"max_run_by_exec": (("a.b", 0.0),)},
        {"cancel_grace_s": 0},
    ],
)
def test_bad_limits_in_the_config_are_refused(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CoreConfig(**config)


@pytest.mark.parametrize("value", [0, -5.0, "10", 1e12, True])
def test_a_bad_max_run_s_in_a_submission_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="max_run_s"):
        SubmitRequest(id="j", exec="a.b", payload=None, max_run_s=value)


def test_a_submission_round_trips_its_limit() -> None:
    submitted = SubmitRequest(id="j", exec="a.b", payload=None, max_run_s=12)
    assert submitted.max_run_s == 12.0 and isinstance(submitted.max_run_s, float)
    assert SubmitRequest.from_dict(submitted.to_dict()) == submitted
    assert "max_run_s" not in SubmitRequest(id="j", exec="a.b", payload=None).to_dict()


# --- failover -----------------------------------------------------------------------------


def _failed_over(now: float, outage_s: float, reconnect_s: float) -> tuple[Dispatcher, Any]:
    """Job j1 (ack timeout 30, limit 60) started at T0, heartbeat at T0 + 20 (deadline
    T0 + 50); a new leader restores the records and resumes at `now`."""
    run = Run()
    assigned = run.start(max_run_s=60.0)
    run(run.core.heartbeat("j1", 1, assigned.lease, T0 + 20))
    records = [JobRecord.from_dict(job.to_dict()) for job in run.core.jobs()]
    core = Dispatcher.restore(records, config=run.core.config)
    return core, core.resume(now, outage_s=outage_s, reconnect_s=reconnect_s)


def test_resume_moves_a_deadline_no_further_than_the_limit() -> None:
    core, events = _failed_over(T0 + 40, outage_s=30.0, reconnect_s=10.0)
    beats = [event for event in events if event.type == "job_heartbeat"]
    assert [beat.deadline for beat in beats] == [T0 + 60]
    check_invariants(core)


def test_resume_still_gives_the_reconnect_window_past_the_limit() -> None:
    core, events = _failed_over(T0 + 58, outage_s=30.0, reconnect_s=10.0)
    beats = [event for event in events if event.type == "job_heartbeat"]
    assert [beat.deadline for beat in beats] == [T0 + 68]
    job = core.job("j1")
    assert job is not None and job.run_limit_at == T0 + 60
    # A heartbeat cannot extend it further; the tick at the window's end stops the attempt.
    (beat,) = core.heartbeat("j1", 1, job.lease or "", T0 + 60)
    assert beat.deadline == T0 + 68  # type: ignore[attr-defined]
    (requeued, *_) = core.tick(T0 + 68)
    assert isinstance(requeued, Requeued) and requeued.reason is RequeueReason.TIME_LIMIT


# --- records --------------------------------------------------------------------------------


def test_a_record_round_trips_its_new_fields() -> None:
    run = Run()
    run.start(max_run_s=60.0)
    run(run.core.cancel("j1", T0 + 5, reason="stop"))
    job = run.job()
    data = job.to_dict()
    assert (data["max_run_s"], data["run_limit_at"], data["cancel_requested_at"]) == (
        60.0,
        T0 + 60,
        T0 + 5,
    )
    assert JobRecord.from_dict(data) == job
    assert job.copy() == job and job.copy() is not job
    folded = fold_job_events(None, [e for e in run.log if getattr(e, "job_id", None) == "j1"])
    assert folded == job


def test_an_old_record_without_the_new_fields_still_loads() -> None:
    run = Run()
    run.start()
    data = run.job().to_dict()
    assert not {"max_run_s", "run_limit_at", "cancel_requested_at"} & set(data)
    assert JobRecord.from_dict(data) == run.job()


@pytest.mark.parametrize("name", ["run_limit_at", "cancel_requested_at"])
@pytest.mark.parametrize("status", ["queued", "succeeded", "dead", "cancelled"])
def test_only_a_running_job_has_a_run_limit_or_a_cancel_request(name: str, status: str) -> None:
    run = Run()
    run.start(max_run_s=60.0)
    data = run.job().to_dict()
    data.update(status=status, deadline=None, run_limit_at=None, cancel_requested_at=None)
    data[name] = T0 + 1
    if status == "queued":
        data.update(worker_id=None, attempts=0)
    if status == "dead":
        data["dead_reason"] = "time_limit"
    with pytest.raises(ValueError, match=rf"{name}: only a running job has one"):
        JobRecord.from_dict(data)
    record = run.job().copy()
    record.status = JobStatus(status)
    record.deadline = None
    record.run_limit_at = None
    record.cancel_requested_at = None
    if status == "queued":
        record.worker_id, record.attempts = None, 0
    if status == "dead":
        record.dead_reason = DeadReason.TIME_LIMIT
    setattr(record, name, T0 + 1)
    with pytest.raises(ValueError, match=name):
        check_record(record)
    # The restore's fast checks refuse what check_record refuses.
    with pytest.raises(ValueError, match=name):
        Dispatcher.restore([record])


def test_a_restored_running_job_keeps_its_limit() -> None:
    run = Run()
    run.start(max_run_s=60.0)
    records = [JobRecord.from_dict(job.to_dict()) for job in run.core.jobs()]
    restored = Dispatcher.restore(records, config=run.core.config)
    check_invariants(restored)
    assert restored.job("j1") == run.job()
    restored.heartbeat("j1", 1, run.job().lease or "", T0 + 29)
    assert restored.job("j1").deadline == T0 + 59  # type: ignore[union-attr]
    (beat,) = restored.heartbeat("j1", 1, run.job().lease or "", T0 + 50)
    assert beat.deadline == T0 + 60  # type: ignore[attr-defined]
    assert types(restored.tick(T0 + 60))[0] == "requeued"

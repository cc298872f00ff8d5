"""The recorded window: jobs, their attempts and the workers, derived from core events."""

from __future__ import annotations

import pytest

from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Assigned, Event, Reassigned
from dispatch.core.leases import seeded_lease_tokens
from dispatch.replay.history import recorded_history
from dispatch.replay.model import Outcome


def core() -> Dispatcher:
    config = CoreConfig(ack_timeout_s=2.0, max_ack_timeout_s=8.0, worker_expiry_s=None)
    return Dispatcher(config, lease_token=seeded_lease_tokens(1))


def assigned(events: list[Event], job_id: str) -> Assigned:
    return next(e for e in events if isinstance(e, Assigned) and e.job_id == job_id)


def test_each_attempt_has_its_run_time_and_outcome() -> None:
    d = core()
    log = d.join("w1", ["job.assign.>"], 100.0) + d.grant_credit("w1", 4, 100.0)
    for job_id in ("ok", "retry", "doomed"):
        log += d.submit(SubmitRequest(id=job_id, exec="demo.echo", payload=None), 101.0)
    ok, retry, doomed = (assigned(log, job_id) for job_id in ("ok", "retry", "doomed"))
    log += d.fail("retry", 1, retry.lease, 101.25, retryable=True)
    log += d.ack("ok", 1, ok.lease, 101.5)
    log += d.fail("doomed", 1, doomed.lease, 102.0, retryable=False)
    again = next(e for e in log[::-1] if isinstance(e, Assigned) and e.job_id == "retry")
    log += d.ack("retry", 2, again.lease, 103.0)

    history = recorded_history(log)

    attempts = {job.job_id: job.attempts for job in history.jobs}
    assert [(a.run_s, a.outcome) for a in attempts["ok"]] == [(0.5, Outcome.COMPLETED)]
    assert [a.outcome for a in attempts["retry"]] == [Outcome.FAILED, Outcome.COMPLETED]
    assert [(a.run_s, a.outcome) for a in attempts["doomed"]] == [(1.0, Outcome.FAILED_PERMANENT)]


def test_a_worker_s_own_retry_delay_and_a_job_s_controls_are_recorded() -> None:
    d = core()
    log = d.join("w1", ["job.assign.>"], 100.0) + d.grant_credit("w1", 4, 100.0)
    request = SubmitRequest(
        id="later", exec="demo.echo", payload=None, retry={"delay_s": 3.0}, ttl_s=60.0
    )
    log += d.submit(request, 101.0)
    first = assigned(log, "later")
    log += d.fail("later", 1, first.lease, 101.5, retry_after_s=9.0)

    (job,) = recorded_history(log).jobs

    assert [(a.outcome, a.retry_after_s) for a in job.attempts] == [(Outcome.FAILED, 9.0)]
    assert job.retry is not None and job.retry.delay_s == 3.0
    assert job.expires_at == 161.0


def test_a_timed_out_attempt_stalls_and_holds_its_slot_as_long_as_the_next_attempt_ran() -> None:
    d = core()
    log = d.join("w1", ["job.assign.>"], 100.0) + d.grant_credit("w1", 2, 100.0)
    log += d.submit(SubmitRequest(id="slow", exec="report.build", payload=None), 100.0)
    log += d.tick(102.0)  # attempt 1 times out after 2 s and is reassigned
    second = next(e for e in log if isinstance(e, Reassigned))
    assert second.at == 102.0
    log += d.ack("slow", 2, second.lease, 105.0)  # attempt 2 ran 3 s

    (job,) = recorded_history(log).jobs

    assert [(a.run_s, a.held_s, a.outcome) for a in job.attempts] == [
        (2.0, 3.0, Outcome.STALLED),
        (3.0, 3.0, Outcome.COMPLETED),
    ]


def test_a_slot_is_held_until_the_workers_credit_for_it_comes_back() -> None:
    d = core()
    log = d.join("w1", ["job.assign.>"], 100.0) + d.grant_credit("w1", 1, 100.0)
    log += d.submit(SubmitRequest(id="slow", exec="x.y", payload=None), 100.0)
    log += d.submit(SubmitRequest(id="quick", exec="x.y", payload=None), 100.0)
    log += d.tick(102.0)  # attempt 1 of slow times out; no credit: it waits in front
    log += d.grant_credit("w1", 1, 107.5)  # its late answer at 107.5 gives the slot back
    slow_2 = assigned(log[-3:], "slow")
    log += d.ack("slow", 2, slow_2.lease, 108.0)
    log += d.grant_credit("w1", 1, 108.25)  # the credit follows the ack a moment later

    jobs = {job.job_id: job for job in recorded_history(log).jobs}

    first, second = jobs["slow"].attempts
    assert (first.outcome, first.held_s) == (Outcome.STALLED, 7.5)
    assert (second.run_s, second.held_s) == (0.5, 0.75)


def test_job_heartbeats_are_kept_as_offsets_into_their_attempt() -> None:
    d = core()
    log = d.join("w1", ["job.assign.>"], 100.0) + d.grant_credit("w1", 1, 100.0)
    log += d.submit(SubmitRequest(id="long", exec="x.y", payload=None), 100.0)
    lease = assigned(log, "long").lease
    log += d.heartbeat("long", 1, lease, 101.5) + d.heartbeat("long", 1, lease, 103.0)
    log += d.ack("long", 1, lease, 104.0)

    (job,) = recorded_history(log).jobs

    assert job.attempts[0].heartbeats == (1.5, 3.0)
    assert job.attempts[0].outcome is Outcome.COMPLETED


def test_the_window_reports_its_own_jobs_and_replays_the_warm_up_and_tail_too() -> None:
    d = core()
    log = d.submit(SubmitRequest(id="long-before", exec="demo.echo", payload=None), 10.0)
    log += d.join("w1", ["job.assign.>"], 100.0) + d.grant_credit("w1", 5, 100.0)
    for job_id, at in (("before", 100.0), ("inside", 110.0)):
        log += d.submit(SubmitRequest(id=job_id, exec="demo.echo", payload=None), at)
    log += d.ack("inside", 1, assigned(log, "inside").lease, 125.0)
    log += d.submit(SubmitRequest(id="after", exec="demo.echo", payload=None), 130.0)

    history = recorded_history(log, since=105.0, until=120.0, warmup_s=10.0)

    assert [job.job_id for job in history.jobs] == ["before", "inside", "after"]
    assert history.reported == {"inside"}
    assert history.jobs[1].attempts[0].run_s == 15.0
    assert {getattr(e, "job_id", None) for e in history.events} == {"inside"}
    assert [job.job_id for job in recorded_history(log, since=105.0).jobs] == ["inside", "after"]


def test_workers_show_their_slots_subjects_and_lifetime() -> None:
    d = core()
    log = d.join("w1", ["job.assign.demo.>"], 100.0) + d.grant_credit("w1", 3, 100.0)
    log += d.submit(SubmitRequest(id="a", exec="demo.echo", payload=None), 101.0)
    log += d.lose_worker("w1", 102.0)

    (worker,) = recorded_history(log).workers

    assert worker.subjects == ("job.assign.demo.>",)
    assert worker.slots == 3
    assert (worker.joined_at, worker.left_at) == (100.0, 102.0)


def test_a_worker_that_joined_before_the_window_gets_the_subjects_of_what_it_ran() -> None:
    d = core()
    early = d.join("w1", ["job.assign.>"], 100.0) + d.grant_credit("w1", 2, 100.0)
    log = d.submit(SubmitRequest(id="a", exec="image.resize", payload=None), 200.0)

    (worker,) = recorded_history(log, since=150.0).workers

    assert early  # the join happened, but is not in the read
    assert worker.joined_at is None
    assert worker.subjects == ("job.assign.image.resize",)
    assert worker.slots == 1


@pytest.mark.parametrize("since", [None, 99.0])
def test_an_empty_read_is_an_empty_history(since: float | None) -> None:
    history = recorded_history([], since=since)
    assert (history.jobs, history.workers, history.events) == ((), (), ())


def test_a_running_job_s_cancel_ends_its_attempt_as_its_worker_or_the_core_ended_it() -> None:
    """Confirmed by the worker: `cancelled`, with how long it took to stop; its grace passed:
    stalled (the worker still held it); its worker lost: stalled. The request's time, who
    asked and why are the cancel to replay."""
    d = core()
    log = d.join("w1", ["job.assign.>"], 100.0) + d.join("w2", ["job.assign.>"], 100.0)
    log += d.grant_credit("w1", 2, 100.0)
    for job_id in ("stops", "ignores"):
        log += d.submit(SubmitRequest(id=job_id, exec="demo.long", payload=None), 101.0)
    log += d.grant_credit("w2", 1, 101.0)
    log += d.submit(SubmitRequest(id="lost", exec="demo.long", payload=None), 101.0)
    on = {job_id: assigned(log, job_id) for job_id in ("stops", "ignores", "lost")}
    assert on["lost"].worker_id == "w2"
    for job_id in ("stops", "ignores", "lost"):
        log += d.cancel(job_id, 102.0, by="ops", reason="why")
    stops = on["stops"]
    log += d.fail("stops", 1, stops.lease, 102.5, error="cancelled", retryable=False)
    log += d.tick(110.0)  # the deadline of "ignores" (103: its ack timeout) has passed
    log += d.lose_worker("w2", 111.0)

    jobs = {job.job_id: job for job in recorded_history(log).jobs}

    assert [a.outcome for a in jobs["stops"].attempts] == [Outcome.CANCELLED]
    assert jobs["stops"].cancel_stop_s == 0.5
    assert (jobs["stops"].cancelled_at, jobs["stops"].cancel_by) == (102.0, "ops")
    assert jobs["stops"].cancel_reason == "why"
    assert [a.outcome for a in jobs["ignores"].attempts] == [Outcome.STALLED]
    assert jobs["ignores"].attempts[0].run_s == 9.0 and jobs["ignores"].cancel_stop_s is None
    assert [a.outcome for a in jobs["lost"].attempts] == [Outcome.STALLED]
    assert jobs["lost"].cancel_stop_s is None and jobs["lost"].cancelled_at == 102.0


def test_an_attempt_its_time_limit_ended_is_recorded_as_such() -> None:
    d = core()
    log = d.join("w1", ["job.assign.>"], 100.0) + d.grant_credit("w1", 2, 100.0)
    request = SubmitRequest(id="capped", exec="a.b", payload=None, max_run_s=1.5)
    log += d.submit(request, 101.0)
    log += d.tick(102.5) + d.tick(104.0)
    (job,) = recorded_history(log).jobs
    assert job.max_run_s == 1.5
    assert (job.attempts[0].outcome, job.attempts[0].run_s) == (Outcome.TIME_LIMIT, 1.5)

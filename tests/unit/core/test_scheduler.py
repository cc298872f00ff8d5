"""The scheduler's decisions: assignment passes (FIFO, round-robin, caps, routing, credit,
worker choice, priorities, delays, fairness), deadlines with backoff, worker loss."""

from __future__ import annotations

from typing import NoReturn

from dispatch.core import (
    Assigned,
    DeadLettered,
    DeadReason,
    JobRecord,
    JobStatus,
    Reassigned,
    Requeued,
    RequeueReason,
    WorkerLost,
)
from tests.unit.core.helpers import (
    T0,
    ack,
    assigned_ids,
    assignments,
    make,
    request,
    types,
    worker,
)


def test_fifo_within_an_exec_queue() -> None:
    d = make()
    d.submit_many([request(f"j{n}") for n in range(5)], T0)
    events = worker(d, "w", credits=5)
    assert assigned_ids(events) == ["j0", "j1", "j2", "j3", "j4"]


def test_round_robin_across_exec_queues() -> None:
    d = make()
    d.submit_many([request(f"a{n}", "resize") for n in range(4)], T0)
    d.submit_many([request(f"b{n}", "crop") for n in range(4)], T0)
    d.submit_many([request(f"c{n}", "mail") for n in range(4)], T0)
    events = worker(d, "w", credits=6)
    assert assigned_ids(events) == ["a0", "b0", "c0", "a1", "b1", "c1"]


def test_busy_exec_queue_does_not_starve_another() -> None:
    d = make(default_cap=100_000)
    d.submit_many([request(f"busy{n}", "busy") for n in range(1_000)], T0)
    d.submit(request("quiet", "quiet"), T0)
    events = worker(d, "w", credits=2)
    assert assigned_ids(events) == ["busy0", "quiet"]


def test_client_at_cap_waits_while_others_go_on() -> None:
    d = make(default_cap=2)
    d.submit_many([request(f"a{n}", client_id="a") for n in range(5)], T0)
    d.submit_many([request(f"b{n}", client_id="b") for n in range(2)], T0)
    events = worker(d, "w", credits=10)
    assert sorted(assigned_ids(events)) == ["a0", "a1", "b0", "b1"]
    assert d.inflight("a") == 2 and d.inflight("b") == 2
    assert d.job("a2").status is JobStatus.QUEUED  # type: ignore[union-attr]


def test_per_client_cap_overrides_the_default() -> None:
    d = make(default_cap=1, caps={"big": 3})
    d.submit_many([request(f"big{n}", client_id="big") for n in range(5)], T0)
    d.submit_many([request(f"small{n}", client_id="small") for n in range(5)], T0)
    worker(d, "w", credits=20)
    assert d.inflight("big") == 3 and d.inflight("small") == 1


def test_capped_client_resumes_when_one_of_its_jobs_settles() -> None:
    d = make(default_cap=1)
    d.submit_many([request("j1"), request("j2")], T0)
    (first,) = assignments(worker(d, "w", credits=5))
    assert first.job_id == "j1"
    events = ack(d, first, T0 + 1)
    assert types(events) == ["completed", "assigned"] and assigned_ids(events) == ["j2"]


def test_job_is_offered_only_to_workers_whose_pattern_matches() -> None:
    d = make()
    worker(d, "mail", ["job.assign.mail.*"], credits=5)
    events = d.submit(request("j1", "image.resize"), T0)
    assert assigned_ids(events) == []
    events = worker(d, "img", ["job.assign.image.*"], credits=5)
    assert [(e.job_id, e.worker_id) for e in assignments(events)] == [("j1", "img")]


def test_star_matches_exactly_one_token() -> None:
    d = make()
    worker(d, "w", ["job.assign.image.*"], credits=5)
    assert assigned_ids(d.submit(request("deep", "image.resize.fast"), T0)) == []
    assert assigned_ids(d.submit(request("one", "image.resize"), T0)) == ["one"]


def test_greater_than_matches_the_rest() -> None:
    d = make()
    worker(d, "w", ["job.assign.image.>"], credits=5)
    assert assigned_ids(d.submit(request("deep", "image.resize.fast"), T0)) == ["deep"]
    assert assigned_ids(d.submit(request("one", "image.resize"), T0)) == ["one"]
    assert assigned_ids(d.submit(request("none", "image"), T0)) == []


def test_worker_may_register_several_patterns() -> None:
    d = make()
    worker(d, "w", ["job.assign.mail.send", "job.assign.image.*"], credits=5)
    events = d.submit_many([request("m", "mail.send"), request("i", "image.crop")], T0)
    assert sorted(assigned_ids(events)) == ["i", "m"]


def test_assignment_spends_one_credit_and_ack_does_not_return_it() -> None:
    d = make()
    (assigned,) = assignments(worker(d, "w", credits=1) + d.submit(request("j1"), T0))
    assert d.worker("w").credit == 0  # type: ignore[union-attr]
    ack(d, assigned, T0 + 1)
    assert d.worker("w").credit == 0  # type: ignore[union-attr]
    assert assigned_ids(d.submit(request("j2"), T0 + 2)) == []
    assert assigned_ids(d.grant_credit("w", 1, T0 + 3)) == ["j2"]


def test_worker_without_credit_gets_nothing() -> None:
    d = make()
    worker(d, "w", credits=0)
    assert assigned_ids(d.submit(request("j1"), T0)) == []
    assert d.job("j1").status is JobStatus.QUEUED  # type: ignore[union-attr]


def test_worker_choice_prefers_fewest_running_then_most_credit() -> None:
    d = make()
    worker(d, "busy", credits=5)
    d.submit(request("j1"), T0)  # busy now runs one job
    worker(d, "rich", credits=3)
    worker(d, "poor", credits=1)
    (choice,) = assignments(d.submit(request("j2"), T0))
    assert choice.worker_id == "rich", "fewest running (0) first, then most credit"
    (choice,) = assignments(d.submit(request("j3"), T0))
    assert choice.worker_id == "poor", "rich runs one job now; poor runs none"


def test_worker_choice_breaks_full_ties_by_worker_id() -> None:
    d = make()
    worker(d, "b", credits=2)
    worker(d, "a", credits=2)
    (choice,) = assignments(d.submit(request("j1"), T0))
    assert choice.worker_id == "a"


def test_ack_deadline_uses_the_initial_timeout_then_exponential_backoff_with_a_cap() -> None:
    d = make(ack_timeout_s=10.0, backoff_multiplier=2.0, max_ack_timeout_s=25.0, max_attempts=4)
    worker(d, "w", credits=3)
    (first,) = assignments(d.submit(request("j1"), T0))
    assert first.deadline == T0 + 10
    (second,) = assignments(d.tick(T0 + 10))
    assert (second.attempt, second.deadline) == (2, T0 + 10 + 20)
    (third,) = assignments(d.tick(T0 + 30))
    assert (third.attempt, third.deadline) == (3, T0 + 30 + 25), "capped at 25 s"


def test_job_timeout_overrides_the_initial_timeout() -> None:
    d = make(ack_timeout_s=10.0, max_ack_timeout_s=20.0)
    worker(d, "w", credits=1)
    (first,) = assignments(d.submit(request("j1", timeout_s=60.0), T0))
    assert first.deadline == T0 + 60, "a longer first timeout than the cap is kept"


def test_nothing_happens_before_the_deadline() -> None:
    d = make(ack_timeout_s=10.0)
    worker(d, "w", credits=1)
    d.submit(request("j1"), T0)
    assert d.tick(T0 + 9.99) == []
    assert d.job("j1").attempts == 1  # type: ignore[union-attr]


def test_timeout_reassigns_to_a_different_matching_worker() -> None:
    d = make(ack_timeout_s=10.0)
    worker(d, "slow", credits=1)
    d.submit(request("j1"), T0)
    worker(d, "other", credits=1)
    worker(d, "unrelated", ["job.assign.mail.*"], credits=5)
    (event,) = d.tick(T0 + 10)
    assert isinstance(event, Reassigned)
    assert (event.worker_id, event.previous_worker_id, event.attempt) == ("other", "slow", 2)
    assert d.worker("other").credit == 0  # type: ignore[union-attr]
    assert d.worker("slow").running == ()  # type: ignore[union-attr]


def test_timeout_falls_back_to_the_same_worker_spending_a_credit() -> None:
    d = make(ack_timeout_s=10.0)
    worker(d, "only", credits=2)
    (first,) = assignments(d.submit(request("j1"), T0))
    (again,) = d.tick(T0 + 10)
    assert isinstance(again, Reassigned)
    assert (again.worker_id, again.attempt) == ("only", 2) and again.lease != first.lease
    # The timed-out attempt may still be running there and holds its slot until the worker
    # gives it back: the new attempt takes another one.
    assert d.worker("only").credit == 0  # type: ignore[union-attr]
    assert d.worker("only").running == ("j1",)  # type: ignore[union-attr]


def test_timeout_requeues_at_the_front_when_the_same_worker_has_no_credit_left() -> None:
    d = make(ack_timeout_s=10.0)
    worker(d, "only", credits=1)
    d.submit(request("j1"), T0)
    d.submit(request("j2"), T0 + 1)
    (event,) = d.tick(T0 + 10)
    assert isinstance(event, Requeued) and event.reason is RequeueReason.TIMEOUT
    assert d.worker("only").running == ()  # type: ignore[union-attr]
    job = d.job("j1")
    assert job is not None and job.status is JobStatus.QUEUED and job.attempts == 1
    (again,) = assignments(d.grant_credit("only", 1, T0 + 11))
    assert (again.job_id, again.attempt) == ("j1", 2), "it waits ahead of later submissions"


def test_one_job_with_two_equal_deadline_entries_expires_once() -> None:
    """A job dead-lettered and redriven at the instant it was assigned is assigned again with
    the same deadline, so the deadline heap holds two entries that both look live: the tick
    must handle the deadline once (not requeue a job that is no longer running, nor reassign
    the new attempt at once)."""
    d = make(ack_timeout_s=10.0)
    worker(d, "w", credits=3)
    (first,) = assignments(d.submit(request("j1"), T0))
    d.fail("j1", 1, first.lease, T0, retryable=False)
    (second,) = assignments(d.redrive("j1", T0))
    assert (second.attempt, second.deadline) == (1, first.deadline)
    (event,) = d.tick(T0 + 10)
    assert isinstance(event, Reassigned) and event.attempt == 2
    assert d.tick(T0 + 10) == []


def test_one_job_with_two_equal_deadline_entries_is_requeued_once() -> None:
    d = make(ack_timeout_s=10.0)
    worker(d, "w", credits=2)
    (first,) = assignments(d.submit(request("j1"), T0))
    d.fail("j1", 1, first.lease, T0, retryable=False)
    assignments(d.redrive("j1", T0))
    (event,) = d.tick(T0 + 10)
    assert isinstance(event, Requeued) and event.reason is RequeueReason.TIMEOUT


def test_timeout_requeues_when_no_worker_matches_any_more() -> None:
    d = make(ack_timeout_s=10.0)
    worker(d, "w", ["job.assign.image.*"], credits=1)
    d.submit(request("j1"), T0)
    d.join("w", ["job.assign.mail.*"], T0 + 1)
    (event,) = d.tick(T0 + 10)
    assert isinstance(event, Requeued) and event.reason is RequeueReason.TIMEOUT
    job = d.job("j1")
    assert job is not None and job.status is JobStatus.QUEUED and job.attempts == 1


def test_max_attempts_of_timeouts_dead_letters_with_the_reason() -> None:
    d = make(ack_timeout_s=10.0, backoff_multiplier=1.0, max_attempts=3)
    worker(d, "w", credits=3)
    d.submit(request("j1"), T0)
    d.tick(T0 + 10)
    d.tick(T0 + 20)
    (event,) = d.tick(T0 + 30)
    assert isinstance(event, DeadLettered) and event.reason is DeadReason.ACK_TIMEOUT
    job = d.job("j1")
    assert job is not None and job.status is JobStatus.DEAD and job.attempts == 3
    assert job.dead_reason is DeadReason.ACK_TIMEOUT and "attempt 3 of 3" in (job.error or "")
    assert [j.id for j in d.dead_letters()] == ["j1"]


def test_worker_loss_requeues_its_jobs_at_once() -> None:
    d = make(ack_timeout_s=60.0)
    worker(d, "w", credits=2)
    d.submit_many([request("j1"), request("j2"), request("j3")], T0)
    events = d.lose_worker("w", T0 + 1, reason="connection reset")
    assert types(events) == ["requeued", "requeued", "worker_lost"]
    assert all(
        isinstance(e, Requeued) and e.reason is RequeueReason.WORKER_LOST for e in events[:2]
    )
    assert d.worker("w") is None
    for job_id in ("j1", "j2"):
        job = d.job(job_id)
        assert job is not None and job.status is JobStatus.QUEUED and job.worker_id is None
        assert "connection reset" in (job.error or "")
    # Nobody else has credit yet; a new worker gets them without waiting for any deadline.
    assert assigned_ids(worker(d, "w2", credits=3, now=T0 + 2)) == ["j1", "j2", "j3"]


def test_requeued_jobs_go_before_later_submissions() -> None:
    d = make()
    worker(d, "w", credits=2)
    d.submit_many([request("j1"), request("j2"), request("j3"), request("j4")], T0)
    d.lose_worker("w", T0 + 1)
    events = worker(d, "w2", credits=4, now=T0 + 2)
    assert assigned_ids(events) == ["j1", "j2", "j3", "j4"]


def test_worker_loss_on_the_last_attempt_dead_letters() -> None:
    d = make(max_attempts=1)
    worker(d, "w", credits=1)
    d.submit(request("j1"), T0)
    events = d.lose_worker("w", T0 + 1)
    assert types(events) == ["dead_lettered", "worker_lost"]
    first = events[0]
    assert isinstance(first, DeadLettered) and first.reason is DeadReason.WORKER_LOST


def test_silent_worker_is_lost_on_tick() -> None:
    d = make(worker_expiry_s=15.0, ack_timeout_s=600.0)
    worker(d, "w", credits=1)
    d.submit(request("j1"), T0)
    assert d.tick(T0 + 14) == []
    events = d.tick(T0 + 15)
    assert types(events) == ["requeued", "worker_lost"]
    lost = events[1]
    assert isinstance(lost, WorkerLost) and "silent" in lost.reason


def test_priority_runs_first_within_an_exec_queue() -> None:
    d = make()
    d.submit_many(
        [request("low1"), request("high", priority=5), request("low2"), request("mid", priority=1)],
        T0,
    )
    events = worker(d, "w", credits=4)
    assert assigned_ids(events) == ["high", "mid", "low1", "low2"]


def test_priority_does_not_cross_exec_queues() -> None:
    d = make()
    d.submit_many([request("a", "alpha"), request("b", "beta", priority=9)], T0)
    assert assigned_ids(worker(d, "w", credits=1)) == ["a"], "exec queues take turns"


def test_delayed_job_waits_until_not_before() -> None:
    d = make()
    worker(d, "w", credits=5)
    assert assigned_ids(d.submit(request("later", delay_s=30.0), T0)) == []
    job = d.job("later")
    assert job is not None and job.not_before == T0 + 30
    assert d.tick(T0 + 29) == []
    assert assigned_ids(d.tick(T0 + 30)) == ["later"]


def test_delayed_job_keeps_its_place_once_due() -> None:
    d = make()
    d.submit(request("early", delay_s=5.0), T0)
    d.submit(request("next"), T0 + 1)
    d.tick(T0 + 10)
    assert assigned_ids(worker(d, "w", credits=2, now=T0 + 10)) == ["early", "next"]


def test_absolute_not_before_in_the_past_runs_at_once() -> None:
    d = make()
    worker(d, "w", credits=2)
    assert assigned_ids(d.submit(request("past", not_before=T0 - 5), T0)) == ["past"]
    assert assigned_ids(d.submit(request("future", not_before=T0 + 5), T0)) == []
    assert assigned_ids(d.tick(T0 + 5)) == ["future"]


def test_fairness_across_clients_within_an_exec_queue() -> None:
    d = make(default_cap=1_000_000)
    d.submit_many([request(f"big{n}", client_id="big") for n in range(100_000)], T0)
    d.submit_many([request(f"small{n}", client_id="small") for n in range(10)], T0)
    events = worker(d, "w", credits=20)
    small = [job_id for job_id in assigned_ids(events) if job_id.startswith("small")]
    assert len(small) == 10, "the client with 10 jobs is not starved by the one with 100k"
    assert assigned_ids(events)[:4] == ["big0", "small0", "big1", "small1"]


def test_time_never_goes_back() -> None:
    d = make(ack_timeout_s=10.0)
    worker(d, "w", credits=1)
    d.tick(T0 + 100)
    (enqueued, assigned) = d.submit(request("j1"), T0)
    assert enqueued.at == T0 + 100 and isinstance(assigned, Assigned)
    assert assigned.deadline == T0 + 110


def test_dispatch_false_defers_assignment_until_dispatch() -> None:
    d = make()
    worker(d, "w", credits=2)
    assert types(d.submit(request("j1"), T0, dispatch=False)) == ["enqueued"]
    assert assigned_ids(d.dispatch(T0)) == ["j1"]


class _NoScan(dict[str, JobRecord]):
    """A jobs table that fails the test if anyone walks it."""

    def __iter__(self) -> NoReturn:
        raise AssertionError("walked every job")

    def values(self) -> NoReturn:
        raise AssertionError("walked every job")

    def items(self) -> NoReturn:
        raise AssertionError("walked every job")


def test_tick_never_walks_all_jobs() -> None:
    d = make(ack_timeout_s=30.0, default_cap=1_000_000, worker_expiry_s=60.0)
    d.submit_many([request(f"j{n}", f"exec{n % 3}.run") for n in range(20_000)], T0)
    worker(d, "w", credits=1_000)
    d.state._jobs = _NoScan(d.state._jobs)
    assert d.tick(T0 + 1) == [], "nothing is due"
    events = d.tick(T0 + 30)
    # The worker has no credit left: the timed-out jobs wait at the front of their queues.
    assert types(events) == ["requeued"] * 1_000
    assert d.tick(T0 + 31) == []

"""Attempt behaviour: recorded, repeated past the recording, drawn for jobs never run."""

from __future__ import annotations

from dispatch.replay.behaviour import INSTANT_SUCCESS, AttemptPlans
from dispatch.replay.model import Attempt, Outcome, RecordedJob


def job(job_id: str, exec_name: str, *attempts: Attempt) -> RecordedJob:
    return RecordedJob(job_id, "acme", exec_name, 0.0, 0, 5, 30.0, None, attempts)


STALL = Attempt(2.0, Outcome.STALLED)
DONE = Attempt(0.5, Outcome.COMPLETED)


def test_attempts_follow_the_recording_then_repeat_the_last() -> None:
    plans = AttemptPlans([job("a", "x.y", STALL, DONE)], seed=0)
    assert [plans.attempt("a", n) for n in (1, 2, 3)] == [STALL, DONE, DONE]


def test_a_job_never_run_behaves_like_a_recorded_job_of_its_exec() -> None:
    donors = [job(f"d{n}", "x.y", Attempt(float(n), Outcome.COMPLETED)) for n in range(20)]
    other = job("o", "other.exec", Attempt(99.0, Outcome.FAILED))
    plans = AttemptPlans([*donors, other, job("new", "x.y")], seed=3)
    assert plans.attempt("new", 1).run_s < 20


def test_the_draw_depends_on_the_seed_and_the_job_not_on_the_other_jobs() -> None:
    donors = [job(f"d{n}", "x.y", Attempt(float(n), Outcome.COMPLETED)) for n in range(50)]
    fresh = [job(f"new{n}", "x.y") for n in range(30)]
    one = AttemptPlans([*donors, *fresh], seed=1)
    again = AttemptPlans([*reversed(fresh), *donors], seed=1)
    alone = AttemptPlans([*donors, fresh[7]], seed=1)
    other_seed = AttemptPlans([*donors, *fresh], seed=2)
    draws = [one.attempt(f"new{n}", 1) for n in range(30)]
    assert draws == [again.attempt(f"new{n}", 1) for n in range(30)]
    assert alone.attempt("new7", 1) == draws[7]
    assert draws != [other_seed.attempt(f"new{n}", 1) for n in range(30)]


def test_with_nothing_recorded_a_job_succeeds_at_once() -> None:
    plans = AttemptPlans([job("new", "x.y")], seed=0)
    assert plans.attempt("new", 1) == INSTANT_SUCCESS[0]

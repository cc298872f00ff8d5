"""How an attempt's end becomes an ack or a failure."""

from __future__ import annotations

import math

import pytest

from dispatch.worker.jobs import (
    Assignment,
    Outcome,
    PermanentError,
    Retry,
    outcome_of_error,
    outcome_of_result,
    released,
)


def test_exceptions_map_to_retryable_or_permanent_failures() -> None:
    assert outcome_of_error(Retry("db busy")) == Outcome("fail", error="db busy", retryable=True)
    assert outcome_of_error(PermanentError("bad input")) == Outcome(
        "fail", error="bad input", retryable=False
    )
    assert outcome_of_error(KeyError("x")) == Outcome("fail", error="KeyError: 'x'")
    assert outcome_of_error(RuntimeError()) == Outcome("fail", error="RuntimeError")
    assert outcome_of_error(Retry()).error == "Retry"
    assert outcome_of_error(PermanentError()).retryable is False


def test_a_result_is_acked_when_it_travels_as_json() -> None:
    assert outcome_of_result({"ok": [1, 2.5, None]}) == Outcome(
        "ack", result={"ok": [1, 2.5, None]}
    )
    assert outcome_of_result(None) == Outcome("ack")
    for bad in ({1, 2}, object(), math.nan):
        outcome = outcome_of_result(bad)
        assert (outcome.kind, outcome.retryable) == ("fail", False)
        assert outcome.error.startswith("the result is not JSON")


def test_a_release_is_a_retryable_failure_naming_the_worker() -> None:
    # No retry delay: the job did not fail, its worker stopped; it may run elsewhere at once.
    assert released("w1") == Outcome(
        "fail", error="worker w1 stopped before the job finished", retry_after_s=0.0
    )


def test_retry_may_say_how_long_to_wait() -> None:
    outcome = outcome_of_error(Retry("rate limited", delay_s=30))
    assert (outcome.kind, outcome.retryable, outcome.retry_after_s) == ("fail", True, 30.0)
    assert outcome.error == "rate limited"
    assert outcome_of_error(Retry("again")).retry_after_s is None, "the job's policy decides"
    with pytest.raises(ValueError, match="delay_s"):
        Retry("x", delay_s=-1)


def test_an_assignment_is_read_from_the_wire() -> None:
    message = {"id": "j", "exec": "a.b", "payload": {"x": 1}, "attempt": 2,
               "deadline": 12.5, "lease": "L", "extra": "ignored"}  # fmt: skip
    assert Assignment.from_message(message, "w1") == Assignment(
        id="j", exec="a.b", payload={"x": 1}, attempt=2, deadline=12.5, lease="L", worker_id="w1"
    )
    with pytest.raises(ValueError, match="attempt"):
        Assignment.from_message({"id": "j"}, "w1")

"""What the transports put on the wire (their behaviour runs in tests/integration/sdk)."""

from __future__ import annotations

from dispatch.worker.jobs import Assignment, Outcome
from dispatch.worker.transports import SETTLEMENT_REFUSALS, _settlement

JOB = Assignment(id="j", exec="a.b", payload=None, attempt=3, deadline=1.0, lease="L",
                 worker_id="w")  # fmt: skip


def test_an_ack_carries_the_result_and_a_failure_its_error_and_kind() -> None:
    assert _settlement(JOB, Outcome("ack", result={"n": 1})) == {
        "type": "ack", "id": "j", "attempt": 3, "lease": "L", "result": {"n": 1},
    }  # fmt: skip
    assert _settlement(JOB, Outcome("fail", error="boom", retryable=False)) == {
        "type": "fail", "id": "j", "attempt": 3, "lease": "L", "error": "boom",
        "retryable": False,
    }  # fmt: skip


def test_refusals_that_no_resend_can_fix_are_known() -> None:
    assert {"stale_lease", "already_settled", "not_found"} <= SETTLEMENT_REFUSALS
    assert "unavailable" not in SETTLEMENT_REFUSALS

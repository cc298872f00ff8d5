"""Rejection codes map to the HTTP statuses the API answers with."""

from __future__ import annotations

from dispatch.core import InvalidTransition, RejectCode, Rejected


def test_every_code_has_an_http_status() -> None:
    statuses = {code: code.http_status for code in RejectCode}
    assert statuses[RejectCode.NOT_FOUND] == 404
    assert statuses[RejectCode.UNKNOWN_WORKER] == 404
    assert statuses[RejectCode.INVALID] == 422
    for code in (
        RejectCode.STALE_LEASE,
        RejectCode.ALREADY_SETTLED,
        RejectCode.NOT_CANCELLABLE,
        RejectCode.NOT_DEAD,
        RejectCode.STALE_EPOCH,
    ):
        assert statuses[code] == 409


def test_rejected_carries_code_detail_and_job() -> None:
    rejection = Rejected(RejectCode.NOT_DEAD, "job 'x' is queued", job_id="x")
    assert (rejection.code, rejection.detail, rejection.job_id) == (
        RejectCode.NOT_DEAD,
        "job 'x' is queued",
        "x",
    )
    assert str(rejection) == "not_dead: job 'x' is queued" and rejection.http_status == 409
    assert RejectCode.NOT_DEAD.value == "not_dead"


def test_invalid_transition_is_a_value_error() -> None:
    assert issubclass(InvalidTransition, ValueError)


def test_a_worker_id_of_another_key_is_forbidden() -> None:
    assert RejectCode.FORBIDDEN.value == "forbidden"
    assert RejectCode.FORBIDDEN.http_status == 403

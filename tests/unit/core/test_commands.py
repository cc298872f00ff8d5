"""SubmitRequest: validated submissions from REST bodies and Kafka records."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch.core import SubmitRequest


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_from_dict_applies_defaults() -> None:
    request = SubmitRequest.from_dict({"id": "j1", "exec": "image.resize", "payload": {"a": 1}})
    assert (request.client_id, request.priority, request.delay_s) == ("default", 0, 0.0)
    assert request.max_attempts is None and request.timeout_s is None
    kafka = SubmitRequest.from_dict(
        {"id": "j1", "exec": "x", "payload": None}, default_client_id="kafka"
    )
    assert kafka.client_id == "kafka"


def test_to_dict_round_trips() -> None:
    request = SubmitRequest(
        id="j1",
        exec="a.b",
        payload=[1],
        client_id="c",
        max_attempts=2,
        timeout_s=5.0,
        priority=-3,
        delay_s=2.5,
    )
    assert SubmitRequest.from_dict(request.to_dict()) == request


def test_integer_times_become_floats() -> None:
    request = SubmitRequest(id="j", exec="x", payload=1, timeout_s=5, delay_s=2)
    assert isinstance(request.timeout_s, float) and isinstance(request.delay_s, float)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"id": ""}, "^id:"),
        ({"id": "x" * 129}, "^id:"),
        ({"exec": "image.*"}, "^exec:"),
        ({"client_id": 5}, "^client_id:"),
        ({"max_attempts": 0}, "^max_attempts:"),
        ({"timeout_s": -1}, "^timeout_s:"),
        ({"priority": "high"}, "^priority:"),
        ({"delay_s": -1}, "^delay_s:"),
        ({"delay_s": 1, "not_before": 5.0}, "not both"),
        ({"colour": "red"}, r"unknown field\(s\) \['colour'\]"),
        # Ids must be one URL path segment (issue 13, item 16).
        ({"id": "a/b"}, r"^id: expected 1 to 128 of A-Z a-z 0-9 \. _ : @ -"),
        ({"id": "a..b"}, r"^id: .*without '\.\.'"),
        ({"id": ".."}, "^id:"),
        ({"id": "."}, "^id:"),
        ({"id": "a b"}, "^id:"),
        ({"id": "a\nb"}, "^id:"),
        ({"id": "é"}, "^id:"),
        # Every number within what the events log and the Delta tables hold (item 7).
        ({"max_attempts": 2**31}, r"^max_attempts: expected an integer <= 1000"),
        ({"max_attempts": 1001}, "^max_attempts:"),
        ({"priority": 2**31}, "^priority:"),
        ({"timeout_s": 7 * 24 * 3600 + 1}, r"^timeout_s: expected a number <= 604800"),
        ({"timeout_s": float("nan")}, "^timeout_s: expected a finite number"),
        ({"timeout_s": 10**400}, "^timeout_s: expected a finite number"),
        ({"delay_s": float("inf")}, "^delay_s:"),
        ({"delay_s": 400 * 24 * 3600}, "^delay_s:"),
        ({"not_before": -1.0}, "^not_before:"),
        ({"not_before": 1e13}, "^not_before:"),
        ({"exec": "x" * 256}, "^exec: longer than 255"),
        ({"exec": "a\x00b"}, "^exec: control characters"),
        ({"exec": 5}, "^exec: expected a string"),
        ({"client_id": "a\tb"}, "^client_id: control characters"),
        # The payload is plain JSON, nested at most 32 deep (items 7, 8, 13).
        ({"payload": {"x": float("nan")}}, r"^payload\.x: NaN is not JSON$"),
        ({"payload": [float("inf")]}, r"^payload\[0\]: Infinity is not JSON$"),
        ({"payload": {"n": 2**64}}, r"^payload\.n: integer outside signed 64 bits"),
        ({"payload": nested(33)}, "^payload: nested deeper than 32 levels$"),
        ({"payload": nested(50_000)}, "^payload: nested deeper than 32 levels$"),
        # A deep value where a scalar belongs is named, not repr'd (RecursionError).
        ({"priority": nested(50_000)}, "^priority: expected an integer, got a list$"),
        ({"id": nested(50_000)}, "^id: expected a non-empty string, got a list$"),
        ({"exec": nested(50_000)}, "^exec: expected a string, got a list$"),
    ],
)
def test_invalid_submissions_name_the_field(changes: dict[str, Any], message: str) -> None:
    data: dict[str, Any] = {"id": "j1", "exec": "image.resize", "payload": {}}
    data.update(changes)
    with pytest.raises(ValueError, match=message):
        SubmitRequest.from_dict(data)


def test_payload_is_required_in_a_record() -> None:
    with pytest.raises(ValueError, match=r"submit\.payload: missing required field"):
        SubmitRequest.from_dict({"id": "j1", "exec": "x"})


@pytest.mark.parametrize("job_id", ["job-1", "a.b", "x:y@z_1", ".a", "a.", "A" * 128, "0"])
def test_ids_safe_in_a_url_are_accepted(job_id: str) -> None:
    assert SubmitRequest(id=job_id, exec="a.b", payload=None).id == job_id


def test_the_largest_accepted_values_pass() -> None:
    request = SubmitRequest(
        id="j",
        exec="x" * 255,
        payload={"deep": nested(31), "n": 2**63 - 1},
        max_attempts=1000,
        timeout_s=7 * 24 * 3600,
        priority=1_000_000,
        delay_s=366 * 24 * 3600,
    )
    assert SubmitRequest.from_dict(request.to_dict()) == request

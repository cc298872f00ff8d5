"""SubmitRequest: validated submissions from REST bodies and Kafka records."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch.core import SubmitRequest


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

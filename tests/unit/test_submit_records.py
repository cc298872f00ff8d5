"""The submit record format any Kafka producer may write, and what a bad record becomes."""

from __future__ import annotations

import json

import pytest

from dispatch.core.commands import SubmitRequest
from dispatch.submit_records import (
    KAFKA_CLIENT_ID,
    MAX_KEPT_BYTES,
    Rejection,
    SubmissionError,
    parse_submit_record,
    submit_record_value,
)

LIMIT = 1024 * 1024


def parse(key: bytes | None, value: bytes | None) -> SubmitRequest:
    return parse_submit_record(key, value, max_payload_bytes=LIMIT)


def _value(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_a_minimal_record_is_a_submission_of_the_kafka_client() -> None:
    submission = parse(b"job-1", _value(id="job-1", exec="image.resize", payload={"w": 100}))
    assert submission.id == "job-1"
    assert submission.exec == "image.resize"
    assert submission.payload == {"w": 100}
    assert submission.client_id == KAFKA_CLIENT_ID


def test_optional_fields_are_kept() -> None:
    submission = parse(
        None,
        _value(
            id="j", exec="a.b", payload=None, client_id="acme", max_attempts=3, timeout_s=5,
            priority=7, delay_s=2.5,
        ),
    )  # fmt: skip
    assert (submission.client_id, submission.max_attempts, submission.timeout_s) == ("acme", 3, 5)
    assert (submission.priority, submission.delay_s) == (7, 2.5)


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        (None, b"\xff\xfe", "value: not UTF-8"),
        (None, b"{not json", "value: not JSON"),
        (None, b"[1, 2]", "value: expected a JSON object"),
        (None, _value(exec="a.b", payload=1), "id"),
        (None, _value(id="j", payload=1), "exec"),
        (None, _value(id="j", exec="a..b", payload=1), "exec"),
        (None, _value(id="j", exec="a.b", payload=1, max_attempts=0), "max_attempts"),
        (None, _value(id="j", exec="a.b", payload=1, colour="red"), "colour"),
        (b"other", _value(id="j", exec="a.b", payload=1), "key"),
    ],
)
def test_a_bad_record_is_refused_with_a_reason_naming_the_field(
    key: bytes | None, value: bytes, field: str
) -> None:
    with pytest.raises(SubmissionError, match=field):
        parse(key, value)


def test_a_tombstone_is_refused() -> None:
    with pytest.raises(SubmissionError, match="tombstone"):
        parse(b"job-1", None)


def test_what_rest_writes_parses_back_to_the_same_submission() -> None:
    original = parse(None, _value(id="j", exec="a.b", payload=[1], priority=2))
    assert parse(b"j", submit_record_value(original)) == original


def test_a_rejection_keeps_the_original_bytes_and_the_reason() -> None:
    rejection = Rejection(
        reason="value: not UTF-8",
        topic="dispatch.submit",
        partition=1,
        offset=42,
        key=b"\x00key",
        value=b"\xff\xfe",
        at=1_700_000_000.5,
    )
    assert Rejection.from_record_value(rejection.to_record_value()) == rejection
    assert json.loads(rejection.to_record_value())["reason"] == "value: not UTF-8"


def test_a_record_over_the_payload_limit_is_refused_not_enqueued() -> None:
    huge = _value(id="j", exec="a.b", payload="x" * (2 * LIMIT))
    with pytest.raises(SubmissionError, match="over the limit"):
        parse(b"j", huge)


def test_a_rejection_of_a_huge_record_keeps_its_head_and_its_size() -> None:
    huge = b"y" * (3 * MAX_KEPT_BYTES)
    rejection = Rejection("value: too big", "t", 0, 1, None, huge, 0.0)
    encoded = rejection.to_record_value()
    assert len(encoded) < 2 * MAX_KEPT_BYTES
    assert json.loads(encoded)["value_bytes"] == len(huge)
    assert Rejection.from_record_value(encoded).value == huge[:MAX_KEPT_BYTES]


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _with_payload(raw: bytes) -> bytes:
    return b'{"id":"j","exec":"a.b","payload":' + raw + b"}"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        # Item 7: a 50,000-deep payload made json.loads raise RecursionError in the leader.
        (_with_payload(_deep(50_000)), r"^value: nested too deep to parse"),
        # Item 8: deep enough to break reads later, shallow enough to parse.
        (_with_payload(_deep(300)), r"^payload: nested deeper than 32 levels$"),
        (_with_payload(_deep(33)), r"^payload: nested deeper than 32 levels$"),
        # Item 13: NaN and Infinity literals are not JSON numbers.
        (_with_payload(b'{"x":NaN}'), r"^payload\.x: NaN is not JSON$"),
        (_with_payload(b"[-Infinity]"), r"^payload\[0\]: -Infinity is not JSON$"),
        (_value(id="j", exec="a.b", payload=1, timeout_s=float("inf")), "^timeout_s:"),
        # Item 7: integers the Delta fold cannot store (int32 columns, int64 values).
        (_value(id="j", exec="a.b", payload=1, max_attempts=2**31), "^max_attempts: .* <= 1000"),
        (_value(id="j", exec="a.b", payload=1, priority=-(2**31)), "^priority:"),
        (_with_payload(b"18446744073709551616"), "^payload: integer outside signed 64 bits"),
        (_with_payload(b"1" * 5000), r"^value: not JSON \(Exceeds the limit"),
        # Item 16: ids that no route could reach.
        (_value(id="a/b", exec="a.b", payload=1), "^id: expected"),
        (_value(id="../x", exec="a.b", payload=1), "^id: expected"),
        # A deep value where a scalar belongs: named, not repr'd.
        (b'{"id":"j","exec":"a.b","payload":1,"priority":' + _deep(900) + b"}", "^priority:"),
    ],
)
def test_hostile_records_are_rejected_with_a_short_reason(value: bytes, reason: str) -> None:
    with pytest.raises(SubmissionError, match=reason) as caught:
        parse(None, value)
    assert len(str(caught.value)) < 300


def test_a_record_just_deep_enough_is_accepted() -> None:
    submission = parse(b"j", _with_payload(_deep(32)))
    depth, value = 0, submission.payload
    while isinstance(value, list):
        depth, value = depth + 1, value[0] if value else None
    assert depth == 32


def test_a_huge_mismatched_key_is_cut_in_the_reason() -> None:
    with pytest.raises(SubmissionError, match=r"^key: ") as caught:
        parse(b"k" * 100_000, _value(id="j", exec="a.b", payload=1))
    assert len(str(caught.value)) < 200

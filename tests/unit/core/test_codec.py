"""Encoding events for the log: one event or an ordered batch per record."""

from __future__ import annotations

import json

import pytest

from dispatch.core import WorkerHeartbeat, decode_events, encode_event, encode_events
from tests.unit.core.samples import SAMPLES


def test_a_batch_round_trips_in_order() -> None:
    data = encode_events(SAMPLES)
    assert isinstance(data, bytes) and data.startswith(b"[{")
    assert decode_events(data) == SAMPLES
    assert decode_events(data.decode()) == SAMPLES


def test_a_single_event_decodes_to_a_list_of_one() -> None:
    assert decode_events(encode_event(SAMPLES[3])) == [SAMPLES[3]]


def test_encoding_is_compact_json() -> None:
    data = encode_event(SAMPLES[4])
    assert b" " not in data and json.loads(data)["type"] == "worker_heartbeat"


def test_non_ascii_payloads_survive() -> None:
    (enqueued,) = [event for event in SAMPLES if event.type == "enqueued"]
    data = enqueued.to_dict()
    data["payload"] = {"name": "寿司 🍣"}
    assert decode_events(json.dumps(data, ensure_ascii=False).encode())[0].to_dict() == data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", r"events: not valid UTF-8 JSON"),
        (b"\xff\xfe", r"events: not valid UTF-8 JSON"),
        (b"42", r"events: expected an object or an array, got int"),
        (
            b'[{"type": "worker_heartbeat", "epoch": 0, "at": 0, "worker_id": "w"}, {"type": 1}]',
            r"event\[1\]: event\.type",
        ),
    ],
)
def test_bad_records_raise_value_errors_with_the_position(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_events(data)


def test_nan_is_refused_on_encoding() -> None:
    broken = WorkerHeartbeat(epoch=0, at=float("nan"), worker_id="w")
    with pytest.raises(ValueError):
        encode_event(broken)

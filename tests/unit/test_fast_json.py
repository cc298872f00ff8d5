from __future__ import annotations

import json
from typing import Any

import pytest

from dispatch import fast_json


@pytest.mark.parametrize(
    "value",
    [
        {"type": "assign", "id": "job-1", "payload": {"n": [1, 2.5, None, True]}, "at": 1e-5},
        {"name": "caf\u00e9 \u6771\u4eac", "emoji": "\U0001f600"},
        [],
        "text",
    ],
)
def test_what_it_writes_reads_back_as_the_same_value(value: Any) -> None:
    assert json.loads(fast_json.dumps(value)) == value
    assert json.loads(fast_json.dumps_text(value)) == value


def test_a_payload_orjson_refuses_is_still_encoded() -> None:
    # A client's payload may hold an integer beyond 64 bits; Python's json takes it, and a
    # submission accepted before must not fail to encode now (the leader's commit would).
    value = {"payload": {"big": 2**70, "negative": -(2**65)}}
    assert json.loads(fast_json.dumps(value)) == value


def test_output_is_compact() -> None:
    assert fast_json.dumps({"a": [1, 2]}) == b'{"a":[1,2]}'

"""check_json_value: what may enter as a payload or a result, refused naming where."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatch.core.bounds import MAX_JSON_DEPTH, check_json_value


def nested_lists(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def nested_objects(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(2**63),
        2**63 - 1,
        1.5e308,
        "text",
        [1, "a", None, {"b": [2.5, False]}],
        (1, 2),
        nested_lists(MAX_JSON_DEPTH),
        nested_objects(MAX_JSON_DEPTH),
    ],
)
def test_plain_json_passes(value: object) -> None:
    check_json_value(value, label="payload")


@pytest.mark.parametrize("make", [nested_lists, nested_objects])
def test_one_level_too_deep_is_refused_naming_the_label(make: Any) -> None:
    with pytest.raises(ValueError, match=rf"^payload: nested deeper than {MAX_JSON_DEPTH} levels"):
        check_json_value(make(MAX_JSON_DEPTH + 1), label="payload")


@pytest.mark.parametrize("make", [nested_lists, nested_objects])
def test_a_50000_deep_value_is_refused_without_recursion(make: Any) -> None:
    # Built without recursion too: json.loads itself would refuse this deep a text.
    with pytest.raises(ValueError, match="nested deeper"):
        check_json_value(make(50_000), label="payload")


def test_the_depth_is_a_parameter() -> None:
    check_json_value([[1]], label="result", max_depth=2)
    with pytest.raises(ValueError, match=r"^result: nested deeper than 1 levels"):
        check_json_value([[1]], label="result", max_depth=1)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"x": float("nan")}, r"^payload\.x: NaN is not JSON$"),
        ([1, {"y": float("inf")}], r"^payload\[1\]\.y: Infinity is not JSON$"),
        (float("-inf"), r"^payload: -Infinity is not JSON$"),
        ({"n": 2**63}, r"^payload\.n: integer outside signed 64 bits"),
        ([-(2**63) - 1], r"^payload\[0\]: integer outside signed 64 bits"),
        ({"a": {1: "x"}}, r"^payload\.a: object key 1 is not a string$"),
        ({"b": b"raw"}, r"^payload\.b: bytes is not a JSON value$"),
        ([{1, 2}], r"^payload\[0\]: set is not a JSON value$"),
    ],
)
def test_non_json_values_are_refused_naming_where(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_json_value(value, label="payload")


def test_a_long_key_is_cut_in_the_message() -> None:
    key = "k" * 10_000
    with pytest.raises(ValueError) as caught:
        check_json_value({key: float("nan")}, label="payload")
    assert len(str(caught.value)) < 100


def test_what_json_parses_from_a_nan_literal_is_refused() -> None:
    # json.loads accepts the literal by default: the check is what keeps it out.
    with pytest.raises(ValueError, match=r"payload\.v: NaN"):
        check_json_value(json.loads('{"v": NaN}'), label="payload")

"""The field checks behind every from_dict: each error names the field."""

from __future__ import annotations

import pytest

from dispatch.core import _validate as v
from dispatch.core.bounds import MAX_ID_LENGTH
from dispatch.core.job import JobStatus


def test_ids_are_non_empty_bounded_strings() -> None:
    assert v.as_id("x" * MAX_ID_LENGTH, "job.id") == "x" * MAX_ID_LENGTH
    for bad in ("", None, 3, "x" * (MAX_ID_LENGTH + 1)):
        with pytest.raises(ValueError, match=r"^job\.id:"):
            v.as_id(bad, "job.id")


def test_numbers_and_ints_refuse_bools_and_non_finite() -> None:
    assert v.as_number(3, "t") == 3.0 and isinstance(v.as_number(3, "t"), float)
    for bad in (True, "1", float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"^t:"):
            v.as_number(bad, "t")
    with pytest.raises(ValueError, match=">= 1"):
        v.as_int(0, "n", minimum=1)
    with pytest.raises(ValueError, match="<= 5"):
        v.as_int(6, "n", maximum=5)
    with pytest.raises(ValueError, match="integer"):
        v.as_int(False, "n")


def test_enums_list_the_allowed_values() -> None:
    assert v.as_enum(JobStatus, "dead", "job.status") is JobStatus.DEAD
    with pytest.raises(ValueError, match="queued, running, succeeded, dead, cancelled"):
        v.as_enum(JobStatus, "lost", "job.status")


def test_check_keys_refuses_unknown_fields_and_non_objects() -> None:
    v.check_keys({"a": 1}, frozenset({"a", "b"}), "x")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['c'\]"):
        v.check_keys({"a": 1, "c": 2}, frozenset({"a"}), "x")
    with pytest.raises(ValueError, match="JSON object"):
        v.check_keys([1], frozenset(), "x")  # type: ignore[arg-type]


def test_string_lists() -> None:
    assert v.as_str_tuple(["a", "b"], "s") == ("a", "b")
    for bad in ("ab", [1], None):
        with pytest.raises(ValueError, match=r"^s"):
            v.as_str_tuple(bad, "s")


def test_submitted_ids_are_safe_as_one_url_segment() -> None:
    for good in ("job-1", "a.b.c", "x:y@z_1", ".a", "a."):
        assert v.as_submitted_id(good, "id") == good
    for bad in ("a/b", "a..b", "..", ".", "a b", "a\nb", "a\x00", "é", "a%2Fb", "x" * 129):
        with pytest.raises(ValueError, match=r"^id:"):
            v.as_submitted_id(bad, "id")


def test_log_ids_keep_the_older_rule_so_old_logs_replay() -> None:
    assert v.as_id("a/b c", "job.id") == "a/b c"


def test_errors_show_a_bad_value_briefly_and_safely() -> None:
    deep: list[object] = []
    for _ in range(50_000):
        deep = [deep]
    shown = [v.show(value) for value in (deep, {"a": 1}, "x" * 10_000, 10**5000, None, 1.5)]
    assert shown[:2] == ["a list", "an object"]
    assert shown[2] == repr("x" * 40) + "..."
    assert shown[3].startswith("an integer of ")
    assert shown[4:] == ["None", "1.5"]
    with pytest.raises(ValueError, match=r"^n: expected an integer, got a list$"):
        v.as_int(deep, "n")
    with pytest.raises(ValueError, match=r"^x: unknown field\(s\) .* and 995 more$"):
        v.check_keys({f"k{n}": n for n in range(1000)}, frozenset(), "x")

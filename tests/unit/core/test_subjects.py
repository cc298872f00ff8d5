"""NATS-style subject matching and name validation."""

from __future__ import annotations

import time

import pytest

from dispatch.core import assign_subject, subject_matches
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.subjects import (
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    compile_pattern,
    validate_exec,
    validate_patterns,
)
from tests.unit.core.helpers import T0, make


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("job.assign.image.resize", "job.assign.image.resize", True),
        ("job.assign.image.*", "job.assign.image.resize", True),
        ("job.assign.image.*", "job.assign.image.resize.fast", False),
        ("job.assign.image.*", "job.assign.image", False),
        ("job.assign.*.resize", "job.assign.video.resize", True),
        ("job.assign.>", "job.assign.image.resize.fast", True),
        ("job.assign.>", "job.assign", False),
        ("job.>", "job.assign.x", True),
        ("*.*.*", "job.assign.x", True),
        ("*.*", "job.assign.x", False),
        ("job.assign.image", "job.assign.image.resize", False),
        ("job.assign.imag", "job.assign.image", False),
    ],
)
def test_pattern_matching(pattern: str, subject: str, expected: bool) -> None:
    assert subject_matches(pattern, subject) is expected


def test_assign_subject_prefixes_the_exec() -> None:
    assert assign_subject("image.resize") == "job.assign.image.resize"


@pytest.mark.parametrize("bad", ["", "a..b", ".a", "a.", "a.>.b", "a.b*", "a.>x", "a b", 3])
def test_bad_patterns_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="subject pattern"):
        compile_pattern(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "a..b", "image.*", "image.>", "a\tb"])
def test_bad_exec_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="exec"):
        validate_exec(bad)


def test_patterns_need_at_least_one_and_drop_duplicates() -> None:
    assert validate_patterns(["a.*", "a.*", "b"]) == ("a.*", "b")
    with pytest.raises(ValueError, match="at least one"):
        validate_patterns([])
    with pytest.raises(ValueError, match="list"):
        validate_patterns("job.>")


def test_a_worker_may_register_at_most_max_patterns() -> None:
    at_the_limit = [f"job.assign.kind{n}" for n in range(MAX_PATTERNS)]
    assert len(validate_patterns(at_the_limit)) == MAX_PATTERNS
    # Duplicates do not count: only distinct patterns cost anything.
    assert validate_patterns(at_the_limit * 3) == tuple(at_the_limit)
    with pytest.raises(ValueError, match=f"at most {MAX_PATTERNS} patterns"):
        validate_patterns([*at_the_limit, "job.assign.one.more"])


def test_a_pattern_may_be_at_most_max_pattern_chars_long() -> None:
    longest = "job.assign." + "x" * (MAX_PATTERN_CHARS - len("job.assign."))
    assert validate_patterns([longest]) == (longest,)
    with pytest.raises(ValueError, match=f"at most {MAX_PATTERN_CHARS} characters"):
        validate_patterns([longest + "x"])


def test_checking_many_patterns_takes_linear_time() -> None:
    # 30,000 distinct patterns took 6.9 s when duplicates were looked up in a list.
    many = [f"job.assign.kind{n}.>" for n in range(30_000)]
    started = time.perf_counter()
    assert len(validate_patterns(many, bounded=False)) == 30_000
    with pytest.raises(ValueError, match="at most"):
        validate_patterns(many)
    assert time.perf_counter() - started < 1.0


def test_a_join_with_too_many_patterns_is_rejected_and_changes_nothing() -> None:
    dispatcher = make()
    too_many = [f"job.assign.kind{n}" for n in range(30_000)]
    with pytest.raises(Rejected, match=f"at most {MAX_PATTERNS} patterns") as refused:
        dispatcher.join("w1", too_many, T0)
    assert refused.value.code is RejectCode.INVALID
    assert dispatcher.workers() == []

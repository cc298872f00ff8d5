"""NATS-style subject matching and name validation."""

from __future__ import annotations

import pytest

from dispatch.core import assign_subject, subject_matches
from dispatch.core.subjects import compile_pattern, validate_exec, validate_patterns


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

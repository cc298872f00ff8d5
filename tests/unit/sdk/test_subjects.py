"""Handler selection by exec pattern, and checking a subscription against the handlers."""

from __future__ import annotations

import pytest

from dispatch.core.subjects import compile_pattern
from dispatch.worker.subjects import HandlerTable, covers, exec_pattern_of, subject_of


def test_exec_patterns_and_subjects_convert_both_ways() -> None:
    assert subject_of("image.*") == "job.assign.image.*"
    assert exec_pattern_of("job.assign.image.>") == "image.>"
    for bad in ("image..x", "im*age", ">.x"):
        with pytest.raises(ValueError):
            subject_of(bad)
    for bad in ("image.*", "job.assign.", "job.other.x", "job.assign.a..b"):
        with pytest.raises(ValueError):
            exec_pattern_of(bad)


@pytest.mark.parametrize(
    ("general", "specific", "expected"),
    [
        ("image.*", "image.resize", True),
        ("image.*", "image.*", True),
        ("image.*", "image.>", False),  # '>' also matches image.a.b, which '*' does not
        ("image.>", "image.*", True),
        ("image.>", "image.a.b", True),
        ("image.>", "image", False),
        (">", "anything.at.all", True),
        ("image.resize", "image.*", False),
        ("image.resize", "image.resize", True),
        ("*.resize", "image.resize", True),
        ("*.resize", "image.crop", False),
        ("image.*", "image.a.b", False),
    ],
)
def test_a_pattern_covers_another_when_it_matches_everything_the_other_does(
    general: str, specific: str, expected: bool
) -> None:
    assert covers(compile_pattern(general), compile_pattern(specific)) is expected


def _table(*patterns: str) -> HandlerTable[str]:
    table: HandlerTable[str] = HandlerTable()
    for pattern in patterns:
        table.add(pattern, pattern)
    return table


@pytest.mark.parametrize(
    ("exec_name", "chosen"),
    [
        ("image.resize", "image.resize"),  # a literal beats any wildcard
        ("image.crop", "image.*"),  # '*' beats '>' at equal literals
        ("image.crop.fast", "image.>"),
        ("video.encode", ">"),
        ("report.build", "*.build"),
    ],
)
def test_the_most_specific_handler_wins(exec_name: str, chosen: str) -> None:
    table = _table(">", "image.>", "image.*", "image.resize", "*.build")
    route = table.route(exec_name)
    assert route is not None and route.handler == chosen


def test_equally_specific_handlers_go_by_registration_order() -> None:
    route = _table("*.resize", "image.*").route("image.resize")
    assert route is not None and route.handler == "*.resize"
    assert _table("image.*").route("video.x") is None


def test_a_table_lists_its_subjects_refuses_duplicates_and_finds_uncovered_subjects() -> None:
    table = _table("image.*", "report.>")
    assert table.subjects == ["job.assign.image.*", "job.assign.report.>"]
    assert table.patterns == ["image.*", "report.>"]
    assert len(table) == 2
    with pytest.raises(ValueError, match="already registered"):
        table.add("image.*", "again")
    with pytest.raises(ValueError):
        table.add("bad..pattern", "x")
    assert table.uncovered(["job.assign.image.resize", "job.assign.report.a.b"]) == []
    assert table.uncovered(["job.assign.image.>", "job.assign.video.*"]) == [
        "job.assign.image.>",
        "job.assign.video.*",
    ]

"""The comparison table for people."""

from __future__ import annotations

from rich.console import Console

from dispatch.replay.render import report_table
from dispatch.replay.report import Comparison, Figures, ReplayReport


def text_of(report: ReplayReport) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(report_table(report))
    return console.export_text()


def test_a_cell_shows_actual_then_simulated_only_where_they_differ() -> None:
    actual = Figures(10, 9, 1, 12, 0.25, 2.5, 4.0, 1.5)
    simulated = Figures(10, 9, 1, 12, 0.25, 1.0, 7.25, 1.5)
    text = text_of(ReplayReport({}, 0, 0, (Comparison("client", "acme", actual, simulated),)))
    assert "acme" in text
    assert "2.50s -> 1.00s" in text
    assert "4.00s -> 7.25s" in text
    assert "250ms ->" not in text  # p50 agrees: one value
    assert "250ms" in text


def test_a_group_without_waits_shows_a_dash() -> None:
    empty = Figures(0, 0, 0, 0, None, None, None, 0.0)
    text = text_of(ReplayReport({}, 0, 0, (Comparison("exec", "x.y", empty, empty),)))
    assert " - " in text

"""A replay report for people: one rich table, a row per group, actual -> simulated."""

from __future__ import annotations

from rich.table import Table

from dispatch.replay.report import Comparison, ReplayReport


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def _pair(actual: str, simulated: str) -> str:
    return actual if actual == simulated else f"{actual} -> {simulated}"


def _row(group: Comparison) -> list[str]:
    actual, simulated = group.actual, group.simulated
    return [
        group.dimension,
        group.key,
        _pair(str(actual.jobs), str(simulated.jobs)),
        _pair(_seconds(actual.queue_wait_p50_s), _seconds(simulated.queue_wait_p50_s)),
        _pair(_seconds(actual.queue_wait_p95_s), _seconds(simulated.queue_wait_p95_s)),
        _pair(_seconds(actual.queue_wait_p99_s), _seconds(simulated.queue_wait_p99_s)),
        _pair(f"{actual.throughput_per_s:.2f}", f"{simulated.throughput_per_s:.2f}"),
        _pair(str(actual.attempts), str(simulated.attempts)),
        _pair(str(actual.dead_lettered), str(simulated.dead_lettered)),
    ]


def report_table(report: ReplayReport) -> Table:
    """The comparison; a cell reads `actual -> simulated`, or one value when both agree."""
    table = Table(title="replay: actual -> simulated", title_justify="left")
    # Group names stay whole (folded onto more lines, never cut with an ellipsis).
    table.add_column("by")
    table.add_column("group", overflow="fold", min_width=12)
    for column in ("jobs", "wait p50", "wait p95", "wait p99", "done/s", "attempts", "dead"):
        table.add_column(column, justify="right")
    for group in report.groups:
        table.add_row(*_row(group))
    return table

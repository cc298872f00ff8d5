"""Tenant service levels from the stats rows: breaches of a wait target, per client and exec,
and the window read from the Delta tables with delta-rs (no Spark)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from deltalake import write_deltalake

from dispatch.delta import tables as t
from dispatch.delta.stats import GROWTH, Histogram, MinuteStats, StatsKey
from dispatch.delta.tenants import (
    BOUNDARY_ERROR,
    breaches,
    read_window,
    tenant_reports,
    window_start,
)
from dispatch.streaming.delta_commits import DeltaCommits
from dispatch.streaming.rollup import StatsRollup, stats_row
from dispatch.warehouse import Warehouse

MINUTE = 1_800_000_000 - 1_800_000_000 % 60
"""A minute start (2027-01-15), so rows fall on a known day."""


def waits(*seconds: float) -> Histogram:
    histogram = Histogram()
    for value in seconds:
        histogram.add(value)
    return histogram


def row(
    client_id: str,
    exec_name: str,
    wait_s: list[float],
    *,
    minute: int = MINUTE,
    group: str = "default",
    **counters: int,
) -> dict[str, Any]:
    """A `stats` row as the fold writes it (its own row builder), with these waits."""
    stats = MinuteStats(queue_wait=waits(*wait_s))
    stats.counters["started"] = len(wait_s)
    stats.counters.update(counters)
    key: StatsKey = (minute, group, exec_name, client_id)
    return stats_row(key, stats)


# --- breaches --------------------------------------------------------------------------------


def test_waits_over_the_target_are_breaches_and_those_under_are_not() -> None:
    assert breaches(waits(0.5, 1.0, 3.0, 4.0, 30.0), 2.0) == 3
    assert breaches(waits(0.5, 1.0), 2.0) == 0
    assert breaches(Histogram(), 2.0) == 0


def test_a_row_entirely_on_one_side_of_the_target_is_counted_exactly() -> None:
    # Every wait within a hair of the target, on either side: the min and max decide.
    assert breaches(waits(2.001, 2.002, 2.003), 2.0) == 3
    assert breaches(waits(1.998, 1.999, 2.0), 2.0) == 0


@pytest.mark.parametrize("target_s", [0.05, 0.7, 2.0, 3.3, 60.0, 900.0])
def test_the_precision_is_the_stated_boundary_error(target_s: float) -> None:
    # A mix straddling the target: waits beyond the stated error are always on the right
    # side; only waits within it may go either way.
    margin = 1 + BOUNDARY_ERROR + 1e-9
    clear_over = [target_s * margin * factor for factor in (1.0, 1.5, 4.0)]
    clear_under = [target_s / margin / factor for factor in (1.0, 1.5, 4.0)]
    assert breaches(waits(*clear_over, *clear_under), target_s) == len(clear_over)
    close = [target_s * 0.97, target_s * 1.03]
    counted = breaches(waits(*clear_over, *clear_under, *close), target_s)
    assert len(clear_over) <= counted <= len(clear_over) + len(close)


def test_the_stated_error_is_half_a_bucket() -> None:
    assert pytest.approx(GROWTH**0.5 - 1) == BOUNDARY_ERROR
    assert 0.04 < BOUNDARY_ERROR < 0.045


def test_a_target_under_a_millisecond_counts_waits_over_a_millisecond() -> None:
    assert breaches(waits(0.0, 0.0005, 0.002, 0.5), 0.0001) == 2


# --- reports ---------------------------------------------------------------------------------


def test_reports_sum_per_client_and_exec_against_each_clients_target() -> None:
    rows = [
        row("acme", "resize", [1.0, 3.0, 5.0], submitted=3, completed=2),
        row("acme", "resize", [4.0], minute=MINUTE + 60, submitted=1, dead=1),
        row("acme", "encode", [0.1], submitted=1),
        row("globex", "resize", [1.0, 3.0, 5.0], submitted=3),
    ]
    targets = {"acme": 2.0}
    reports = tenant_reports(rows, lambda client: targets.get(client, 10.0))
    assert list(reports) == ["acme", "globex"]
    acme = reports["acme"]
    assert acme.target_s == 2.0
    assert acme.execs["resize"].breaches == 3  # 3, 5 and 4 s over 2 s
    assert acme.execs["encode"].breaches == 0
    totals = acme.total.columns()
    assert totals["breaches"] == 3
    assert (totals["submitted"], totals["started"], totals["completed"], totals["dead"]) == (
        5,
        5,
        2,
        1,
    )
    assert totals["queue_wait_n"] == 5
    assert totals["queue_wait_max_s"] == 5.0
    assert totals["queue_wait_p50_s"] == pytest.approx(3.0, rel=0.05)
    # The same waits are no breach under globex's 10 s target.
    assert reports["globex"].total.breaches == 0


def test_the_window_is_the_current_minute_and_the_ones_before() -> None:
    assert window_start(MINUTE + 30.5, 1) == MINUTE
    assert window_start(MINUTE + 30.5, 15) == MINUTE - 14 * 60


# --- the window read from Delta ----------------------------------------------------------------


def _create(warehouse: Warehouse, name: str) -> None:
    write_deltalake(
        warehouse.table(name),
        t.empty_table(name),
        partition_by=t.PARTITIONS[name] or None,
    )


def _append_partial(warehouse: Warehouse, rows: list[dict[str, Any]], batch: int) -> None:
    partial = [
        {
            **{k: v for k, v in one.items() if not k.endswith(("_p50_s", "_p95_s", "_p99_s"))},
            "batch_end": batch,
            "batch_id": batch,
        }
        for one in rows
    ]
    DeltaCommits(warehouse).append(
        t.STATS_PARTIAL,
        t.arrow_rows(t.STATS_PARTIAL, partial),
        app_id="test-app",
        version=batch,
        metadata="{}",
    )


def test_no_tables_read_as_no_rows(tmp_path: Path) -> None:
    assert read_window(Warehouse.at(tmp_path / "delta"), "default", MINUTE, MINUTE + 60) == []


def test_the_window_holds_rolled_up_and_pending_rows_once_each(tmp_path: Path) -> None:
    warehouse = Warehouse.at(tmp_path / "delta")
    _create(warehouse, t.STATS)
    _create(warehouse, t.STATS_PARTIAL)
    _append_partial(warehouse, [row("acme", "resize", [3.0], submitted=1)], batch=1)
    _append_partial(warehouse, [row("acme", "resize", [0.5], submitted=1)], batch=2)
    assert StatsRollup(warehouse, every_s=0).run("test-app") == 1  # both batches, one row
    # Not rolled up yet: a later batch, another group, and a minute before the window.
    _append_partial(
        warehouse,
        [
            row("acme", "resize", [4.0], submitted=1),
            row("acme", "resize", [9.0], group="other-group", submitted=1),
            row("acme", "resize", [9.0], minute=MINUTE - 3600, submitted=1),
        ],
        batch=3,
    )
    found = read_window(warehouse, "default", MINUTE - 60, MINUTE + 59)
    report = tenant_reports(found, lambda _client: 2.0)["acme"].total.columns()
    assert report["submitted"] == 3
    assert report["queue_wait_n"] == 3
    assert report["breaches"] == 2  # 3 s and 4 s
    # Rolled up again: the same answer (nothing lost, nothing counted twice).
    StatsRollup(warehouse, every_s=0).run("test-app")
    again = read_window(warehouse, "default", MINUTE - 60, MINUTE + 59)
    assert tenant_reports(again, lambda _client: 2.0)["acme"].total.columns() == report


def test_minutes_on_two_days_are_both_read(tmp_path: Path) -> None:
    warehouse = Warehouse.at(tmp_path / "delta")
    _create(warehouse, t.STATS)
    midnight = int(dt.datetime(2027, 1, 16, tzinfo=dt.UTC).timestamp())
    rows = [
        row("acme", "resize", [1.0], minute=midnight - 60),
        row("acme", "resize", [1.0], minute=midnight),
    ]
    write_deltalake(
        warehouse.table(t.STATS), t.arrow_rows(t.STATS, rows), mode="append", partition_by=["date"]
    )
    found = read_window(warehouse, "default", midnight - 60, midnight + 30)
    assert len(found) == 2

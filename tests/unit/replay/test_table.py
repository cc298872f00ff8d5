"""The Delta table `replays`."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from dispatch.replay.report import Comparison, Figures, ReplayReport
from dispatch.replay.table import REPLAYS, SCHEMA, append_replay, replay_rows
from dispatch.warehouse import Warehouse

WHEN = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def report(cap: int) -> ReplayReport:
    actual = Figures(10, 9, 1, 12, 0.25, 2.5, 4.0, 1.5)
    simulated = Figures(10, 8, 2, 14, 0.5, 3.0, None, 1.25)
    groups = (
        Comparison("all", "all", actual, simulated),
        Comparison("client", "acme", actual, simulated),
    )
    return ReplayReport({"set": [f"dispatcher.default_cap={cap}"]}, 100, 90, groups)


def test_a_run_is_one_run_row_and_a_row_per_group() -> None:
    rows = replay_rows(report(5), "r1", WHEN).to_pylist()
    assert [(r["row_kind"], r["dimension"], r["key"]) for r in rows] == [
        ("run", None, None),
        ("group", "all", "all"),
        ("group", "client", "acme"),
    ]
    assert json.loads(rows[0]["parameters"]) == {"set": ["dispatcher.default_cap=5"]}
    assert rows[2]["actual_attempts"] == 12 and rows[2]["simulated_attempts"] == 14
    assert rows[2]["simulated_queue_wait_p99_s"] is None
    assert all(r["run_id"] == "r1" and r["created_at"] == WHEN for r in rows)


def test_runs_append_to_one_table_readable_with_delta_rs(tmp_path: Path) -> None:
    warehouse = Warehouse.at(tmp_path / "delta")
    assert append_replay(warehouse, report(5), "r1", WHEN) == 0
    assert append_replay(warehouse, report(6), "r2", WHEN) == 1
    table = warehouse.open(REPLAYS).to_pyarrow_table()
    assert table.schema.equals(SCHEMA)
    runs = [r for r in table.to_pylist() if r["row_kind"] == "run"]
    assert sorted(json.loads(r["parameters"])["set"][0] for r in runs) == [
        "dispatcher.default_cap=5",
        "dispatcher.default_cap=6",
    ]
    assert table.num_rows == 6

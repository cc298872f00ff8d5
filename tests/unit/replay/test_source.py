"""Reading the window from the Delta `events` table (delta-rs, the fold's schema)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from deltalake import write_deltalake

from dispatch.core.events import Event, WorkerHeartbeat
from dispatch.delta import tables as t
from dispatch.replay.source import WindowError, read_events, window_sql
from dispatch.streaming.decode import KafkaRow, LoggedEvent, event_bronze_row, submit_bronze_row
from dispatch.warehouse import Warehouse
from tests.unit.replay.recording import write_events_table

DAY = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def beat(worker_id: str, at: float) -> Event:
    return WorkerHeartbeat(epoch=1, at=at, worker_id=worker_id)


def row(event: Event, offset: int, *, group: str = "default", admitted: bool = True) -> dict:  # type: ignore[type-arg]
    kafka = KafkaRow(
        "dispatch.events", 0, offset, None, b"", dt.datetime.fromtimestamp(event.at, dt.UTC)
    )
    return event_bronze_row(LoggedEvent(0, offset, 0, group, 1, event), kafka, admitted, 0)


def test_the_window_is_the_groups_admitted_events_in_log_order(tmp_path: Path) -> None:
    warehouse = Warehouse.at(tmp_path / "delta")
    submit = KafkaRow("dispatch.submit", 0, 0, b"k", b"{}", dt.datetime.fromtimestamp(DAY, dt.UTC))
    rows = [
        row(beat("late", DAY + 86_400 * 2), 5),  # two days later: another date partition
        row(beat("in-2", DAY + 20), 4),
        row(beat("fenced", DAY + 15), 3, admitted=False),
        row(beat("other-group", DAY + 12), 2, group="other"),
        row(beat("in-1", DAY + 10), 1),
        row(beat("before", DAY - 10), 0),
        submit_bronze_row(submit, 0),
    ]
    write_deltalake(
        warehouse.table(t.EVENTS), t.arrow_rows(t.EVENTS, rows), partition_by=t.PARTITIONS[t.EVENTS]
    )

    events = read_events(warehouse, group="default", since=DAY, until=DAY + 30, tail_s=0)

    assert [e.worker_id for e in events] == ["in-1", "in-2"]  # type: ignore[attr-defined]
    everything = read_events(warehouse, group="default")
    assert [e.worker_id for e in everything] == ["before", "in-1", "in-2", "late"]  # type: ignore[attr-defined]
    tail = read_events(warehouse, group="default", since=DAY, until=DAY + 1, tail_s=3 * 86_400)
    assert len(tail) == 3


def test_a_version_reads_the_table_as_the_fold_had_written_it_then(tmp_path: Path) -> None:
    warehouse = Warehouse.at(tmp_path / "delta")
    write_events_table(warehouse, [beat("w", DAY + n) for n in range(10)], batch_rows=4)
    assert len(read_events(warehouse, group="default", version=1)) == 4
    assert len(read_events(warehouse, group="default")) == 10


def test_a_missing_table_a_missing_version_or_a_reversed_window_is_a_clear_error(
    tmp_path: Path,
) -> None:
    warehouse = Warehouse.at(tmp_path / "delta")
    with pytest.raises(WindowError, match="no Delta table"):
        read_events(warehouse, group="default")
    write_events_table(warehouse, [beat("w", DAY)])
    with pytest.raises(WindowError, match="version 42"):
        read_events(warehouse, group="default", version=42)
    with pytest.raises(WindowError, match="--until must be after --since"):
        read_events(warehouse, group="default", since=DAY, until=DAY)


def test_the_query_bounds_dates_so_partitions_are_skipped() -> None:
    sql = window_sql("g'1", DAY, DAY + 86_400)
    assert "dispatch_group = 'g''1'" in sql
    assert "date >= DATE '2026-01-01'" in sql and "date <= DATE '2026-01-02'" in sql

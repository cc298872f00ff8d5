"""The Delta table `replays`: every replay run, for notebooks.

One flat table (no nesting, so Spark SQL, delta-rs and pandas read it alike), unpartitioned:

- one `run` row per replay: `run_id`, `created_at`, `parameters` (the run's parameters as
  JSON: window, version, group, seed, fleet, policy), `input_events`, `simulated_events`;
- one `group` row per (dimension, key) of that run: `dimension` (`all`, `exec`, `client`),
  `key`, and for each figure an `actual_` and a `simulated_` column.

Group rows repeat the `run_id` (join them to their run) and leave `parameters` null.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dispatch.replay.report import Figures, ReplayReport

if TYPE_CHECKING:
    from dispatch.warehouse import Warehouse

REPLAYS = "replays"

_COUNTS = ("jobs", "completed", "dead_lettered", "attempts")
_SECONDS = ("queue_wait_p50_s", "queue_wait_p95_s", "queue_wait_p99_s", "throughput_per_s")

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("row_kind", pa.string()),
        ("parameters", pa.string()),
        ("input_events", pa.int64()),
        ("simulated_events", pa.int64()),
        ("dimension", pa.string()),
        ("key", pa.string()),
        *[
            (f"{side}_{name}", pa.int64() if name in _COUNTS else pa.float64())
            for side in ("actual", "simulated")
            for name in (*_COUNTS, *_SECONDS)
        ],
    ]
)


def _figures(side: str, figures: Figures) -> dict[str, Any]:
    values = figures.to_dict()
    return {f"{side}_{name}": values[name] for name in (*_COUNTS, *_SECONDS)}


def replay_rows(report: ReplayReport, run_id: str, created_at: dt.datetime) -> pa.Table:
    """The run's rows, in the table's schema."""
    rows: list[dict[str, Any]] = [
        {
            "run_id": run_id,
            "created_at": created_at,
            "row_kind": "run",
            "parameters": json.dumps(report.parameters, sort_keys=True),
            "input_events": report.input_events,
            "simulated_events": report.simulated_events,
        }
    ]
    for group in report.groups:
        rows.append(
            {
                "run_id": run_id,
                "created_at": created_at,
                "row_kind": "group",
                "dimension": group.dimension,
                "key": group.key,
                **_figures("actual", group.actual),
                **_figures("simulated", group.simulated),
            }
        )
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def append_replay(
    warehouse: Warehouse, report: ReplayReport, run_id: str, created_at: dt.datetime
) -> int:
    """Append the run to `replays` (created on first use); returns the table's new version."""
    from deltalake import write_deltalake

    write_deltalake(
        warehouse.table(REPLAYS),
        replay_rows(report, run_id, created_at),
        mode="append",
        storage_options=warehouse.storage_options or None,
        configuration={"delta.enableDeletionVectors": "false"},
    )
    return warehouse.open(REPLAYS).version()

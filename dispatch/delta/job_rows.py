"""The rows of the Delta `jobs` table and the core's records they hold, both ways.

Shared by everything that reads or writes `jobs`: the streaming fold (`dispatch.streaming.fold`),
the leader's rebuild (`dispatch.delta.snapshot`), the views and the notebooks. Besides the core's
`JobRecord`, each row keeps two timestamps the statistics need and the record does not hold:
`queued_at` (when the job last entered its queue) and `started_at` (when its latest attempt
started), and `part`: `open` for the rows later events can change, `closed` for final ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from dispatch.core.job import DeadReason, JobRecord, JobStatus
from dispatch.core.progress import stored_progress
from dispatch.core.retry import RetryPolicy

OPEN = "open"
"""`jobs.part` of queued, running and dead jobs: the only rows later events can change."""
CLOSED = "closed"
"""`jobs.part` of succeeded, cancelled and expired jobs: final until the leader prunes them."""
CLOSED_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.CANCELLED, JobStatus.EXPIRED})

JobKey = tuple[str, str]
"""(dispatch group, job id)."""


@dataclass(slots=True)
class JobState:
    """A job's core record plus the two timestamps the statistics need."""

    record: JobRecord
    queued_at: float | None = None
    started_at: float | None = None

    @property
    def part(self) -> str:
        return CLOSED if self.record.status in CLOSED_STATUSES else OPEN


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _unjson(text: str | None) -> Any:
    return None if text is None else json.loads(text)


JOB_RECORD_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(JobRecord))
"""The columns of `jobs` that are `JobRecord.to_dict()` (payload and result as JSON text)."""
_LATER_NUMBERS = ("expires_at", "max_run_s", "run_limit_at", "cancel_requested_at")
"""Number columns `JobRecord.to_dict` leaves out when unset (the rows always have them)."""


def job_row(group: str, state: JobState) -> dict[str, Any]:
    """The `jobs` row of a job (payload and result as JSON text)."""
    row = state.record.to_dict()
    row["payload"] = _json(row["payload"])
    row["result"] = _json(row["result"])
    # Left out of `to_dict` when unset; the columns are always there.
    row["retry"] = _json(row.get("retry"))
    row["progress"] = _json(row.get("progress"))
    for name in _LATER_NUMBERS:
        row.setdefault(name, None)
    row.setdefault("key", None)
    row["dispatch_group"] = group
    row["queued_at"] = state.queued_at
    row["started_at"] = state.started_at
    row["part"] = state.part
    return row


def job_state(row: Mapping[str, Any]) -> tuple[JobKey, JobState]:
    """Read a `jobs` row back: the record goes through `JobRecord.from_dict` (validated)."""
    # `get`: a row of a table from before the later columns has none of them.
    data = {name: row.get(name) for name in JOB_RECORD_COLUMNS}
    data["payload"] = _unjson(data["payload"])
    data["result"] = _unjson(data["result"])
    data["retry"] = _unjson(data["retry"])
    data["progress"] = _unjson(data["progress"])
    record = JobRecord.from_dict(data)
    key = (str(row["dispatch_group"]), record.id)
    return key, JobState(record, row.get("queued_at"), row.get("started_at"))


def record_from_row(row: Mapping[str, Any]) -> JobRecord:
    """Just the core record of a `jobs` (or `jobs_archive`) row."""
    return job_state(row)[1].record


_STATUSES: dict[str | None, JobStatus] = {status.value: status for status in JobStatus}
_DEAD_REASONS: dict[str | None, DeadReason] = {reason.value: reason for reason in DeadReason}


def records_from_arrow(table: Any) -> list[JobRecord]:
    """The core records of `jobs` rows in an Arrow table, column by column.

    Far faster than `JobRecord.from_dict` per row (BENCHMARKS.md, *Rebuild with 1,000,000
    jobs of history*, `latest_snapshot`): the rows were written from records the core made,
    so the field-by-field parsing is skipped (and `Dispatcher.restore` checks each record's
    status against its fields).
    Each column becomes Python values in one pass (in Arrow where it can), and the records
    are built by `map`, with no Python code per row but JobRecord's own `__init__`."""
    columns: list[list[Any]] = []
    present = set(table.column_names)
    for name in JOB_RECORD_COLUMNS:  # JobRecord's fields in constructor order
        if name not in present:
            # A column added after the table was written (`retry`, `expires_at`,
            # `max_run_s`, ...): unset.
            columns.append([None] * table.num_rows)
            continue
        column = table.column(name)
        if name == "retry":
            # Nearly always all NULL (jobs with their exec's policy): no parsing then.
            if column.null_count == len(column):
                columns.append([None] * len(column))
            else:
                columns.append([_retry(value) for value in _json_values(column, name)])
        elif name == "progress":
            # NULL but for jobs a worker reported on; validated, as `JobRecord.from_dict` does.
            if column.null_count == len(column):
                columns.append([None] * len(column))
            else:
                columns.append([stored_progress(value) for value in _json_values(column, name)])
        elif name in _SHARED:
            columns.append(_shared_values(column, _SHARED[name]))
        elif name in _JSON:
            columns.append(_json_values(column, name))
        else:
            columns.append(column.to_pylist())
    return list(map(JobRecord, *columns))


def _retry(value: Any) -> RetryPolicy | None:
    return None if value is None else RetryPolicy.from_dict(value, "jobs.retry")


def _shared_values(column: Any, names: Mapping[str | None, Any] | None) -> list[Any]:
    """`column.to_pylist()` for a string column of few distinct values, with one Python
    object per distinct value, mapped through `names` if given (KeyError names a value it
    does not have, NULL being None, as a lookup per row did).

    Arrow finds the distinct values, so only they become Python objects: faster than a
    string per row, and a million rows share a handful of objects, as the core's interned
    exec names and client ids do anyway."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(column.combine_chunks())
    distinct: list[Any] = encoded.dictionary.to_pylist()
    if encoded.null_count:
        distinct.append(None)  # the index NULL gets below
    if names is not None:
        distinct = [names[value] for value in distinct]
    if len(distinct) == 1:
        return distinct * len(column)  # one exec, no dead job...: no index to look up
    indices = pc.fill_null(encoded.indices, len(distinct) - 1).to_pylist()
    return list(map(distinct.__getitem__, indices))


def _json_values(column: Any, name: str) -> list[Any]:
    """The JSON texts of a column as Python values (NULL and JSON null both mean None).

    One JSON document for the whole column, joined in Arrow: a `json.loads` per value, or
    a Python string per value to join, would cost more than the parsing."""
    import pyarrow as pa
    import pyarrow.compute as pc

    # large_string: the joined text of a big column may pass the 2 GiB of a string value.
    texts = pc.fill_null(column, "null").cast(pa.large_string()).combine_chunks()
    whole = pa.LargeListArray.from_arrays(pa.array([0, len(texts)], pa.int64()), texts)
    joined = pc.binary_join(whole, pa.scalar(",", pa.large_string()))[0].as_py()
    values: list[Any] = json.loads("[" + joined + "]")
    rows = len(column)
    if len(values) != rows:
        # A text holding more than one JSON value (never written by `job_row`).
        raise ValueError(f"jobs.{name}: {len(values)} JSON values in {rows} rows")
    return values


_SHARED: dict[str, Mapping[str | None, Any] | None] = {
    "client_id": None,
    "exec": None,
    "status": _STATUSES,
    "worker_id": None,
    "dead_reason": {None: None, **_DEAD_REASONS},
}
"""String columns of few distinct values, and what each value stands for (None: itself)."""
_JSON = frozenset({"payload", "result"})

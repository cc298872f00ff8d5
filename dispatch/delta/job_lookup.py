"""Finished jobs read back from Delta: a job's newest life by id, and the ids of the jobs that
finished since a time.

The leader keeps a finished job in memory for a few minutes only; after that, what the API
shows of it and whether a resubmitted id was already used come from the tables the fold
writes: `jobs` (every job the leader held at the last batch, finished ones in its `closed`
partition until the leader prunes them) and `jobs_archive` (the lives the leader pruned, one
row per life). Both readers are delta-rs only (no JVM), read through DataFusion, which reads
the `string_view` columns delta-rs's MERGE writes (`dispatch.delta_sql`).

**Order of the reads.** The fold moves a pruned life in two commits: its `jobs_archive` append,
then the `jobs` MERGE that deletes it (docs/streaming.md, *One micro-batch*). Both readers open
`jobs` first and `jobs_archive` only after `jobs` was read, so a life the fold moves between
the two reads is found in the archive: it was appended there before it left `jobs`. The other
order could miss it in both.

**Cost.** Job ids are random, chosen by clients: the files' min/max statistics on `id` span
nearly the whole id space, so no file and no row group is skipped for an id, and a lookup
scans the `dispatch_group` and `id` columns of every file of `jobs` and of the archive;
delta-rs's scan evaluates the filter in the Parquet reader, so the other columns are decoded
for the matching rows only (EXPLAIN ANALYZE: `pushdown_rows_pruned`). `finished_ids_since`
reads four columns of `jobs`' closed partition and of the archive's days from `since`'s on
(the earlier `date` partitions are not opened), and skips the files whose `updated_at`
statistics end before `since`. Measured: docs/streaming.md, *`jobs_archive`*.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dispatch.core.job import JobRecord
from dispatch.delta import tables as t
from dispatch.delta.job_rows import CLOSED, CLOSED_STATUSES, JOB_RECORD_COLUMNS, record_from_row
from dispatch.delta_sql import query, sql_text

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from dispatch.warehouse import Warehouse

MAX_IDS_PER_QUERY = 500
"""Ids per `IN (...)` list: DataFusion overflows its stack on lists of tens of thousands of
literals (dispatch/delta_sql.py). Each query scans the `id` column of every file whatever
the list's length, so shorter lists cost more in all: measured on 100,000 archived lives,
one query of 500 ids took ~4x one of a single id, five queries of 100 twice one of 500."""

FINISHED_STATUSES: tuple[str, ...] = tuple(sorted(status.value for status in CLOSED_STATUSES))
"""The statuses of a finished job (succeeded, cancelled, expired): the `closed` part of `jobs`,
and every life in `jobs_archive` (the leader prunes only finished jobs)."""


def find_jobs(warehouse: Warehouse, group: str, ids: Sequence[str]) -> dict[str, JobRecord]:
    """The newest life in Delta of each of `ids` in dispatcher group `group`, by id; ids with
    none are absent. A row of `jobs` (open or closed) is the job's current life and wins over
    its archived ones; of several archived lives, the one archived last (greatest
    `archived_at`, then `updated_at`). Tables not created yet hold nothing: {}.

    Raises ValueError (from `JobRecord.from_dict`) for a row that does not read back as a
    record: the fold writes only rows the core made."""
    wanted = list(dict.fromkeys(ids))
    found: dict[str, JobRecord] = {}
    if not wanted:
        return found
    jobs = warehouse.open_if_exists(t.JOBS)
    if jobs is not None:
        rows = _rows_of(jobs, t.JOBS, group, wanted, order=("updated_at",))
        found.update((job_id, record_from_row(row)) for job_id, row in rows.items())
    # Opened after `jobs` was read (see the module's docstring), and only for what it lacked.
    missing = [job_id for job_id in wanted if job_id not in found]
    if missing:
        archive = warehouse.open_if_exists(t.JOBS_ARCHIVE)
        if archive is not None:
            order = ("archived_at", "updated_at")
            rows = _rows_of(archive, t.JOBS_ARCHIVE, group, missing, order=order)
            found.update((job_id, record_from_row(row)) for job_id, row in rows.items())
    return found


def _rows_of(
    table: DeltaTable, name: str, group: str, ids: Sequence[str], *, order: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """The rows of `ids` in `table`, the greatest by `order` for an id with several."""
    present = {field.name for field in table.schema().fields}
    # The record's columns, its group and what orders lives: not `queued_at`, `started_at`,
    # `part` or `date`. A table written before the later columns lacks them;
    # `record_from_row` takes an absent column as unset.
    read = [
        column for column in ("dispatch_group", *JOB_RECORD_COLUMNS, *order) if column in present
    ]
    columns = ", ".join(f'"{column}"' for column in dict.fromkeys(read))
    best: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), MAX_IDS_PER_QUERY):
        chunk = ids[start : start + MAX_IDS_PER_QUERY]
        sql = (
            f'SELECT {columns} FROM "{name}"'
            f' WHERE "dispatch_group" = {sql_text(group)}'
            f' AND "id" IN ({", ".join(sql_text(job_id) for job_id in chunk)})'
        )
        for row in query(table, name, sql).to_pylist():
            job_id = row["id"]
            held = best.get(job_id)
            if held is None or _rank(row, order) > _rank(held, order):
                best[job_id] = row
    return best


def _rank(row: Mapping[str, Any], order: Iterable[str]) -> tuple[float, ...]:
    # A NULL (never written by the fold) ranks below every time.
    return tuple(-math.inf if row.get(name) is None else float(row[name]) for name in order)


def finished_ids_since(
    warehouse: Warehouse, group: str, since: float, batch_rows: int = 65536
) -> Iterator[list[tuple[str, float]]]:
    """(id, finish time) of group `group`'s jobs that finished (succeeded, cancelled or
    expired) with `updated_at >= since`, from `jobs`' closed partition and from
    `jobs_archive`, in lists of `batch_rows` (the last one shorter). An id appears once per
    finished life found: a job finished in `jobs` and archived before, or archived twice,
    appears more than once (callers collect a set). Tables not created yet hold nothing.

    Reads four columns, streamed in DataFusion's record batches: memory holds a batch or two
    of ids, however large the tables. `jobs` is read at the version it has when the first
    list is asked for, the archive at the one it has when `jobs` has been read (see the
    module's docstring)."""
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be at least 1, not {batch_rows}")
    if math.isnan(since):
        raise ValueError("since must be a time, not NaN")
    if since == math.inf:
        return iter(())
    # Checked above when called, read when iterated.
    return _batched(_finished_batches(warehouse, group, since), batch_rows)


def _finished_batches(warehouse: Warehouse, group: str, since: float) -> Iterator[pa.RecordBatch]:
    condition = f'"dispatch_group" = {sql_text(group)} AND "status" IN ({_statuses()})'
    if since > -math.inf:
        # As text cast in SQL: any float's repr reads back exactly, whatever its notation.
        condition += f' AND "updated_at" >= CAST({sql_text(repr(since))} AS DOUBLE)'
    # Only the ids and finish times come out; the scan reads the condition's columns besides.
    select = '"id", "updated_at"'
    jobs = warehouse.open_if_exists(t.JOBS)
    if jobs is not None:
        closed = f'"part" = {sql_text(CLOSED)}'
        sql = f'SELECT {select} FROM "{t.JOBS}" WHERE {closed} AND {condition}'
        yield from _nonempty(jobs, t.JOBS, sql)
    archive = warehouse.open_if_exists(t.JOBS_ARCHIVE)  # after `jobs` (module docstring)
    if archive is not None:
        first_day = _day_of(since)
        days = "" if first_day is None else f"\"date\" >= DATE '{first_day.isoformat()}' AND "
        sql = f'SELECT {select} FROM "{t.JOBS_ARCHIVE}" WHERE {days}{condition}'
        yield from _nonempty(archive, t.JOBS_ARCHIVE, sql)


def _statuses() -> str:
    return ", ".join(sql_text(status) for status in FINISHED_STATUSES)


def _day_of(since: float) -> dt.date | None:
    """The UTC day of `since`: `jobs_archive.date` is the UTC day of the life's `updated_at`,
    so a life with `updated_at >= since` is in that day's partition or a later one. None
    when `since` is outside the days a date holds."""
    try:
        return dt.datetime.fromtimestamp(since, dt.UTC).date()
    except (OverflowError, OSError, ValueError):
        # Outside the years a date holds: the `updated_at` condition alone decides.
        return None


def _nonempty(table: DeltaTable, name: str, sql: str) -> Iterator[pa.RecordBatch]:
    """The record batches of `sql`'s result that hold rows."""
    for batch in _stream(table, name, sql):
        if batch.num_rows:
            yield batch


def _batched(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[list[tuple[str, float]]]:
    """The (id, updated_at) rows of `batches` in lists of `size` (the last one shorter, none
    empty)."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        if count < size:
            continue
        whole = pa.Table.from_batches(held)
        start = 0
        while whole.num_rows - start >= size:
            yield _pairs(whole.slice(start, size))
            start += size
        rest = whole.slice(start)
        held = rest.to_batches() if rest.num_rows else []
        count = rest.num_rows
    if count:
        yield _pairs(pa.Table.from_batches(held))


def _pairs(rows: pa.Table) -> list[tuple[str, float]]:
    ids = rows.column(0).cast(pa.string()).to_pylist()
    return list(zip(ids, rows.column(1).to_pylist(), strict=True))


def _stream(table: DeltaTable, name: str, sql: str) -> Iterator[pa.RecordBatch]:
    """`sql` over `table` registered as `name`, one record batch at a time as DataFusion
    makes them (its reader executes the plan as it is read, not before)."""
    from deltalake import QueryBuilder

    reader = QueryBuilder().register(name, table).execute(sql)
    yield from pa.RecordBatchReader.from_stream(reader)

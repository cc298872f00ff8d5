"""The open partition of `jobs`, kept by the driver between batches.

A batch folded on the driver needs the current rows of the jobs it touches, and only open jobs
can change. Reading the open partition through delta-rs each batch costs what the backlog of
queued jobs holds (ids are chosen by clients, random, so no file statistics narrow the read to
the touched ids; see `BatchWriter._current_jobs`). `OpenJobs` reads it once, then follows the
writer's own commits: after each `jobs` MERGE it takes that MERGE's source (the touched jobs'
new rows), so a batch costs what it touches, not what is queued.

The rows stay in Arrow (chunks appended batch by batch), with a dict from job key to row
position, not as a Python record per job: a million queued jobs take ~330 MB, 200 MB of it
the Arrow rows (BENCHMARKS.md, *Streaming*, *Batch cost against the backlog*). Rows superseded
by later chunks are dropped by a rebuild once they outnumber the live ones.

It holds `jobs` as of one table version (`version`). The writer checks that version against
the table before using it (`BatchWriter._open_jobs`): a commit it does not know to leave the
open rows alone (another writer's, an operator's) makes it read the partition again, as a
restarted writer does; a batch that fails drops it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from dispatch.delta import tables as t
from dispatch.delta.job_rows import OPEN, JobKey

if TYPE_CHECKING:
    from deltalake import DeltaTable

_JOBS = t.SCHEMAS[t.JOBS]

_COMBINE_AFTER = 32
"""Chunks appended since the last combine before the small ones are joined into one: a take
touches one chunk per position, and the per-chunk overhead grows with their number."""


class OpenJobs:
    """The open rows of `jobs` at table version `version`: row positions by job key."""

    rebuild_after = 100_000
    """Superseded rows kept at least (the rebuild costs a pass over the live ones)."""

    def __init__(self, rows: pa.Table, version: int) -> None:
        self.version = version
        """The `jobs` version these rows are the open partition of."""
        self._chunks: list[pa.Table] = []
        self._starts: list[int] = []
        """The position of each chunk's first row."""
        self._size = 0
        self._positions: dict[str, dict[str, int]] = {}
        """Per dispatch group, job id -> position of its current row."""
        self._live = 0
        self._index(rows)

    @classmethod
    def load(cls, table: DeltaTable) -> OpenJobs:
        """The open partition of `table` at the handle's version (one full read)."""
        # The partition is pruned from the log; the files are read whole (see
        # BatchWriter._current_jobs on why nothing is pushed down).
        read = table.to_pyarrow_dataset(file_pruning_predicate=[("part", "=", OPEN)]).to_table()
        # delta-rs's MERGE writes `string_view` columns: the cache holds the table's types.
        return cls(read.select(_JOBS.names).cast(_JOBS), table.version())

    def __len__(self) -> int:
        return self._live

    @property
    def nbytes(self) -> int:
        """Bytes of the Arrow rows held (superseded ones included; the dict not)."""
        return sum(chunk.nbytes for chunk in self._chunks)

    def rows(self, keys: Iterable[JobKey]) -> pa.Table:
        """The current rows of those of `keys` that are open, in no particular order."""
        positions = sorted(
            position
            for group, job_id in keys
            if (position := self._positions.get(group, {}).get(job_id)) is not None
        )
        if not positions:
            return _JOBS.empty_table()
        parts: list[pa.Table] = []
        for index, offsets in self._by_chunk(positions):
            parts.append(self._chunks[index].take(pa.array(offsets, pa.int64())))
        return pa.concat_tables(parts)

    def apply(self, source: pa.Table, version: int) -> None:
        """Follow a committed `jobs` MERGE (`version`) of `source` (`planned.JOBS_SOURCE`:
        a row per touched job, `_delete` for a job that left `jobs`): the rows that stay open
        replace the jobs' rows, the others leave."""
        groups = source.column("dispatch_group").to_pylist()
        ids = source.column("id").to_pylist()
        stays = pc.and_(
            pc.invert(pc.fill_null(source.column("_delete"), False)),
            pc.equal(source.column("part"), OPEN),
        )
        stays = pc.fill_null(stays, False)
        for group, job_id in zip(groups, ids, strict=True):
            if self._positions.get(group, {}).pop(job_id, None) is not None:
                self._live -= 1
        position = self._size
        for group, job_id, open_ in zip(groups, ids, stays.to_pylist(), strict=True):
            if open_:
                self._positions.setdefault(group, {})[job_id] = position
                self._live += 1
                position += 1
        self._append(source.filter(stays).select(_JOBS.names).cast(_JOBS))
        self.version = version
        if self._size - self._live > max(self._live, self.rebuild_after):
            self._rebuild()
        elif len(self._chunks) > _COMBINE_AFTER:
            self._combine()

    def _index(self, rows: pa.Table) -> None:
        """Hold `rows` alone (every one live)."""
        self._chunks, self._starts, self._size, self._positions = [], [], 0, {}
        groups = rows.column("dispatch_group").to_pylist()
        for position, (group, job_id) in enumerate(
            zip(groups, rows.column("id").to_pylist(), strict=True)
        ):
            by_id = self._positions.setdefault(group, {})
            if job_id in by_id:
                raise RuntimeError(f"jobs holds job {(group, job_id)} twice")
            by_id[job_id] = position
        self._live = rows.num_rows
        self._append(rows)

    def _append(self, rows: pa.Table) -> None:
        if rows.num_rows:
            self._chunks.append(rows.combine_chunks())
            self._starts.append(self._size)
            self._size += rows.num_rows

    def _by_chunk(self, positions: list[int]) -> Iterator[tuple[int, list[int]]]:
        """Sorted positions as (chunk index, offsets within it)."""
        current, offsets = -1, list[int]()
        for position in positions:
            index = bisect_right(self._starts, position) - 1
            if index != current:
                if offsets:
                    yield current, offsets
                current, offsets = index, []
            offsets.append(position - self._starts[index])
        if offsets:
            yield current, offsets

    def _combine(self) -> None:
        """Join every chunk after the first into one (positions do not change)."""
        first, rest = self._chunks[0], self._chunks[1:]
        self._chunks = [first, pa.concat_tables(rest).combine_chunks()]
        self._starts = [0, first.num_rows]

    def _rebuild(self) -> None:
        """Keep only the live rows (superseded ones outnumber them)."""
        keys = [(group, job_id) for group, ids in self._positions.items() for job_id in ids]
        self._index(self.rows(keys))


def value_ranges(values: Iterable[int], limit: int) -> list[tuple[int, int]]:
    """At most `limit` disjoint (low, high) ranges, in order, covering every one of `values`:
    split at the widest gaps between them."""
    return cover_ranges(((value, value) for value in values), limit)


def cover_ranges(ranges: Iterable[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """At most `limit` disjoint (low, high) ranges, in order, covering every one of `ranges`:
    the overlapping or adjacent ones joined, then split at the widest gaps between them. (The
    executors' fold gives each partition's ranges; the driver joins them into one condition.)"""
    joined: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if joined and low <= joined[-1][1] + 1:
            joined[-1] = (joined[-1][0], max(joined[-1][1], high))
        else:
            joined.append((low, high))
    if not joined:
        return []
    widest = sorted(
        range(1, len(joined)), key=lambda i: joined[i][0] - joined[i - 1][1], reverse=True
    )
    cuts = sorted(widest[: limit - 1])
    return [
        (joined[start][0], joined[end - 1][1])
        for start, end in zip([0, *cuts], [*cuts, len(joined)], strict=True)
    ]


def narrowing(column: str, values: Iterable[int | None], limit: int = 16) -> str:
    """A SQL condition true for every one of `values` in `column`: at most `limit`
    `column >= low AND column <= high` ranges (`value_ranges`), and `column IS NULL` for a
    None. That is the form delta-rs's MERGE turns into file skipping over the column's min/max
    statistics (it leaves a BETWEEN out of its file filter), and a few ranges keep the condition
    short however many jobs the batch touches. FALSE for no value."""
    listed = list(values)
    return ranges_condition(
        column,
        value_ranges((v for v in listed if v is not None), limit),
        with_null=any(value is None for value in listed),
    )


def ranges_condition(column: str, ranges: Sequence[tuple[int, int]], *, with_null: bool) -> str:
    """`narrowing`'s condition over ranges already joined (`cover_ranges`)."""
    terms = [
        f"{column} = {low}" if low == high else f"({column} >= {low} AND {column} <= {high})"
        for low, high in ranges
    ]
    if with_null:
        terms.append(f"{column} IS NULL")
    return f"({' OR '.join(terms)})" if terms else "FALSE"

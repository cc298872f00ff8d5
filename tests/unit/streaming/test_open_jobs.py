"""`dispatch.streaming.open_jobs`: the open partition of `jobs` kept between batches, and the `seq`
condition that narrows a MERGE to the files holding the touched rows (delta-rs tables on disk)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given
from hypothesis import strategies as st

from dispatch.core.job import JobRecord, JobStatus
from dispatch.delta import tables as t
from dispatch.delta.job_rows import CLOSED, OPEN, JobState, job_row, job_state
from dispatch.streaming.open_jobs import OpenJobs, cover_ranges, narrowing, value_ranges
from dispatch.streaming.planned import JOBS_SOURCE


def record(job_id: str, seq: int, status: JobStatus = JobStatus.QUEUED) -> JobRecord:
    return JobRecord(
        id=job_id, client_id="c", exec="e", payload={"n": seq}, max_attempts=3, timeout_s=30.0,
        submitted_at=1.0, updated_at=float(seq), seq=seq, status=status,
    )  # fmt: skip


def source(rows: Sequence[tuple[str, JobRecord | None]]) -> pa.Table:
    """A `jobs` MERGE source: (group, new record, or None for a job that left `jobs`)."""
    out = []
    for group, new in rows:
        if new is None:
            row = dict.fromkeys(JOBS_SOURCE.names)
            row.update(dispatch_group=group, id="gone", part=OPEN, _delete=True)
        else:
            row = {**job_row(group, JobState(new)), "_delete": False}
        out.append(row)
    return pa.Table.from_pylist(out, schema=JOBS_SOURCE)


def jobs_table(path: Path, rows: list[tuple[str, JobRecord]]) -> DeltaTable:
    arrow = t.arrow_rows(t.JOBS, [job_row(group, JobState(rec)) for group, rec in rows])
    write_deltalake(path, arrow, partition_by=t.PARTITIONS[t.JOBS])
    return DeltaTable(path)


def held(cache: OpenJobs, keys: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The `seq` of each held key's row."""
    return {key: state.record.seq for key, state in map(job_state, cache.rows(keys).to_pylist())}


def test_the_cache_holds_the_open_rows_and_follows_merges(tmp_path: Path) -> None:
    table = jobs_table(
        tmp_path / "jobs",
        [
            ("g", record("a", 1)),
            ("g", record("b", 2)),
            ("h", record("a", 3)),
            ("g", record("done", 4, JobStatus.SUCCEEDED)),
        ],
    )
    cache = OpenJobs.load(table)
    assert cache.version == table.version() and len(cache) == 3
    keys = [("g", "a"), ("g", "b"), ("h", "a"), ("g", "done"), ("g", "new")]
    assert held(cache, keys) == {("g", "a"): 1, ("g", "b"): 2, ("h", "a"): 3}

    # b moves on (a new row), the group h job closes, a new job arrives, a is pruned.
    gone = source([("g", None)]).set_column(1, "id", pa.array(["a"]))
    cache.apply(
        pa.concat_tables(
            [
                source([("g", record("b", 20)), ("h", record("a", 30, JobStatus.SUCCEEDED))]),
                source([("g", record("new", 50))]),
                gone,
            ]
        ),
        version=7,
    )
    assert cache.version == 7 and len(cache) == 2
    assert held(cache, keys) == {("g", "b"): 20, ("g", "new"): 50}
    assert cache.rows([]).num_rows == 0
    assert cache.rows([("g", "b")]).schema == t.SCHEMAS[t.JOBS]


def test_many_merges_with_rebuilds_keep_the_cache_equal_to_a_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(OpenJobs, "rebuild_after", 10)
    monkeypatch.setattr("dispatch.streaming.open_jobs._COMBINE_AFTER", 3)
    rng = random.Random(5)
    model = {("g", f"j{n}"): n for n in range(40)}
    initial = [(group, record(job_id, seq)) for (group, job_id), seq in model.items()]
    cache = OpenJobs.load(jobs_table(tmp_path / "jobs", initial))
    seq = 100
    for version in range(1, 60):
        touched = rng.sample(sorted(model), min(len(model), rng.randint(0, 6)))
        rows: list[tuple[str, JobRecord]] = []
        for group, job_id in touched:
            seq += 1
            status = rng.choice([JobStatus.QUEUED, JobStatus.SUCCEEDED])
            rows.append((group, record(job_id, seq, status)))
            if status is JobStatus.SUCCEEDED:
                del model[(group, job_id)]
            else:
                model[(group, job_id)] = seq
        for _ in range(rng.randint(0, 4)):
            seq += 1
            rows.append(("g", record(f"n{seq}", seq)))
            model[("g", f"n{seq}")] = seq
        cache.apply(source(rows), version)
        assert held(cache, [*model, ("g", "missing")]) == model
        assert len(cache) == len(model)


@given(st.lists(st.integers(-(2**40), 2**40), max_size=60), st.integers(1, 20))
def test_value_ranges_cover_every_value_in_few_disjoint_ranges(
    values: list[int], limit: int
) -> None:
    ranges = value_ranges(values, limit)
    assert len(ranges) <= limit
    assert all(low <= high for low, high in ranges)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
    assert all(any(low <= value <= high for low, high in ranges) for value in values)
    # As many ranges as it may use, or fewer only where values are consecutive.
    runs = sum(b - a > 1 for a, b in itertools.pairwise(sorted(set(values)))) + bool(values)
    assert len(ranges) == min(limit, runs)


@given(
    st.lists(
        st.tuples(st.integers(-1000, 1000), st.integers(0, 50)).map(lambda r: (r[0], r[0] + r[1])),
        max_size=40,
    ),
    st.integers(1, 20),
)
def test_cover_ranges_joins_the_partitions_ranges_into_few_disjoint_ones(
    ranges: list[tuple[int, int]], limit: int
) -> None:
    """The executors' partitions each report their ranges: the joined ones cover them all."""
    joined = cover_ranges(ranges, limit)
    assert len(joined) <= limit
    assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(joined))
    assert all(any(lo <= low and high <= hi for lo, hi in joined) for low, high in ranges)
    assert bool(joined) == bool(ranges)


def test_narrowing_as_sql() -> None:
    assert narrowing("t.seq", []) == "FALSE"
    assert narrowing("t.seq", [None]) == "(t.seq IS NULL)"
    assert narrowing("t.seq", [5, 1, 2, 3, 100, None], limit=2) == (
        "((t.seq >= 1 AND t.seq <= 5) OR t.seq = 100 OR t.seq IS NULL)"
    )


def test_a_narrowed_merge_scans_only_the_files_that_may_hold_its_rows(tmp_path: Path) -> None:
    """delta-rs skips the files whose `seq` statistics miss the ranges, and the result is
    the unnarrowed MERGE's."""
    # Ids as clients choose them (random): their statistics narrow nothing.
    rng = random.Random(3)
    ids = [f"{rng.getrandbits(128):032x}" for _ in range(10_000)]
    rows = [("g", record(ids[n], n)) for n in range(10_000)]
    arrow = t.arrow_rows(t.JOBS, [job_row(g, JobState(r)) for g, r in rows])
    results = {}
    for narrowed in (False, True):
        path = tmp_path / f"narrowed-{narrowed}"
        # Files of about 1,000 rows, as ten batches would have written them.
        write_deltalake(
            path,
            arrow.to_batches(max_chunksize=1000),
            partition_by=t.PARTITIONS[t.JOBS],
            target_file_size=1,
        )
        files = len(DeltaTable(path).file_uris())
        assert files >= 9
        touched = [5, 6, 7, 4200, 4210]
        merged = source(
            [("g", record(ids[n], n, JobStatus.SUCCEEDED)) for n in touched]
            + [("g", record("fresh", 10_000))]
        )
        condition = f" AND {narrowing('t.seq', touched)}" if narrowed else ""
        columns = {name: f"s.`{name}`" for name in t.SCHEMAS[t.JOBS].names}
        metrics = (
            DeltaTable(path)
            .merge(
                merged,
                f"t.part = '{OPEN}'{condition} AND t.dispatch_group = s.dispatch_group"
                " AND t.id = s.id",
                source_alias="s",
                target_alias="t",
                streamed_exec=False,
            )
            .when_matched_update(updates=columns)
            .when_not_matched_insert(updates=columns)
            .execute()
        )
        results[narrowed] = sorted(
            DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda row: str(row["id"])
        )
        # The files holding seq 5-7 and 4200-4210 (a range may straddle two); or all of them.
        scanned = metrics["num_target_files_scanned"]
        assert scanned <= 4 if narrowed else scanned == files
        assert metrics["num_target_rows_updated"] == len(touched)
        assert metrics["num_target_rows_inserted"] == 1
    assert results[True] == results[False]
    assert sum(row["part"] == CLOSED for row in results[True]) == len(touched)

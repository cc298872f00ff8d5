"""Finished jobs read back from Delta (`dispatch.delta.job_lookup`): a job's newest life by id,
and the ids of the jobs finished since a time. Tables created by Spark (`create_tables`, as the
fold creates them); `jobs` rows written by a delta-rs MERGE, as the fold's driver path writes
them (its files hold `string_view` columns), archived lives appended as the fold appends them
(`fold.archived_row`)."""

from __future__ import annotations

import datetime as dt
import math
import shutil
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from deltalake import write_deltalake

from dispatch.core.job import DeadReason, JobRecord, JobStatus
from dispatch.delta import tables as t
from dispatch.delta.job_lookup import MAX_IDS_PER_QUERY, find_jobs, finished_ids_since
from dispatch.delta.job_rows import JobState, job_row
from dispatch.streaming.fold import ArchivedLife, archived_row
from dispatch.warehouse import Warehouse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

GROUP = "default"
OTHER = "other"
HOUR = 3600.0
DAY = 24 * HOUR
T0 = 1_800_000_000.0
"""2027-01-15 08:00 UTC."""


def record(
    job_id: str, status: JobStatus, updated_at: float, *, result: Any = None, seq: int = 1
) -> JobRecord:
    """A record in `status` whose fields agree with it (`JobRecord.from_dict` checks them)."""
    fields: dict[str, Any] = {
        "id": job_id,
        "client_id": "acme",
        "exec": "image.resize",
        "payload": {"url": f"https://example.com/{job_id}.png", "width": 640},
        "max_attempts": 3,
        "timeout_s": 30.0,
        "submitted_at": updated_at - 10.0,
        "updated_at": updated_at,
        "seq": seq,
        "status": status,
    }
    if status in (JobStatus.SUCCEEDED, JobStatus.RUNNING, JobStatus.DEAD):
        fields.update(attempts=1, worker_id="w1")
    if status is JobStatus.SUCCEEDED:
        fields["result"] = result
    elif status is JobStatus.RUNNING:
        fields.update(lease=f"lease-{job_id}", deadline=updated_at + 30.0)
    elif status is JobStatus.DEAD:
        fields.update(
            attempts=3, error="boom", dead_reason=DeadReason.PERMANENT_FAILURE, worker_id="w1"
        )
    return JobRecord(**fields)


def put_jobs(warehouse: Warehouse, group: str, records: Iterable[JobRecord]) -> None:
    """Upsert rows of `jobs` with a delta-rs MERGE, as the fold's driver path writes them."""
    rows = t.arrow_rows(t.JOBS, [job_row(group, JobState(job)) for job in records])
    (
        warehouse.open(t.JOBS)
        .merge(
            rows,
            "t.dispatch_group = s.dispatch_group AND t.id = s.id",
            source_alias="s",
            target_alias="t",
        )
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )


def archive(warehouse: Warehouse, group: str, lives: Sequence[tuple[JobRecord, float]]) -> None:
    """Append pruned lives (record, `archived_at`) to `jobs_archive`, one commit."""
    rows = [archived_row(ArchivedLife(group, JobState(job), at)) for job, at in lives]
    write_deltalake(
        warehouse.open(t.JOBS_ARCHIVE), t.arrow_rows(t.JOBS_ARCHIVE, rows), mode="append"
    )


def all_ids(batches: Iterable[list[tuple[str, float]]]) -> list[str]:
    return sorted(job_id for batch in batches for job_id, _ in batch)


@pytest.fixture(scope="module")
def empty_tables(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tables as the fold creates them, once for the module (each test copies them)."""
    folder = tmp_path_factory.mktemp("job-lookup") / "delta"
    t.create_tables(spark, Warehouse.at(folder))
    return folder


@pytest.fixture
def warehouse(empty_tables: Path, tmp_path: Path) -> Warehouse:
    folder = tmp_path / "delta"
    shutil.copytree(empty_tables, folder)
    return Warehouse.at(folder)


def test_a_job_only_in_the_archive_is_found_with_its_result(warehouse: Warehouse) -> None:
    done = record("a1", JobStatus.SUCCEEDED, T0, result={"ok": True, "thumbs": [1, 2]})
    archive(warehouse, GROUP, [(done, T0 + 60.0)])
    put_jobs(warehouse, GROUP, [record("open1", JobStatus.QUEUED, T0)])

    found = find_jobs(warehouse, GROUP, ["a1"])

    assert found == {"a1": done}
    assert found["a1"].result == {"ok": True, "thumbs": [1, 2]}
    assert found["a1"].status is JobStatus.SUCCEEDED


def test_a_row_of_jobs_wins_over_the_archived_lives(warehouse: Warehouse) -> None:
    archive(
        warehouse,
        GROUP,
        [
            (record("again", JobStatus.SUCCEEDED, T0, result="first life"), T0 + 60.0),
            (record("closed", JobStatus.SUCCEEDED, T0, result="first life"), T0 + 60.0),
        ],
    )
    # Both submitted again after the prune: one runs now, one finished again and the leader
    # has not pruned it yet (the closed partition).
    running = record("again", JobStatus.RUNNING, T0 + 120.0)
    closed = record("closed", JobStatus.CANCELLED, T0 + 120.0)
    put_jobs(warehouse, GROUP, [running, closed])

    assert find_jobs(warehouse, GROUP, ["again", "closed"]) == {
        "again": running,
        "closed": closed,
    }


def test_of_several_archived_lives_the_last_archived_wins(warehouse: Warehouse) -> None:
    first = record("x", JobStatus.SUCCEEDED, T0, result="first")
    second = record("x", JobStatus.CANCELLED, T0 + 2 * DAY)  # another date partition
    # The newer life is appended first: the answer does not follow the files' order.
    archive(warehouse, GROUP, [(second, T0 + 2 * DAY + 60.0)])
    archive(warehouse, GROUP, [(first, T0 + 60.0)])
    # Archived at the same time: the later update wins.
    older = record("tie", JobStatus.SUCCEEDED, T0, result="older")
    newer = record("tie", JobStatus.SUCCEEDED, T0 + 5.0, result="newer")
    archive(warehouse, GROUP, [(newer, T0 + 60.0), (older, T0 + 60.0)])

    assert find_jobs(warehouse, GROUP, ["x", "tie"]) == {"x": second, "tie": newer}


def test_other_groups_and_unknown_ids_are_not_found(warehouse: Warehouse) -> None:
    theirs = record("theirs", JobStatus.SUCCEEDED, T0, result=1)
    archived = record("archived-theirs", JobStatus.SUCCEEDED, T0, result=2)
    put_jobs(warehouse, OTHER, [theirs])
    archive(warehouse, OTHER, [(archived, T0 + 60.0)])
    # An id a SQL literal must escape (ids read back from the log follow older rules).
    quoted = record("o'brien", JobStatus.SUCCEEDED, T0, result=3)
    slashed = record("back\\'slash", JobStatus.SUCCEEDED, T0, result=4)
    archive(warehouse, GROUP, [(quoted, T0 + 60.0), (slashed, T0 + 60.0)])

    asked = ["theirs", "archived-theirs", "unknown", "o'brien", "back\\'slash", "' OR '1'='1"]
    assert find_jobs(warehouse, GROUP, asked) == {"o'brien": quoted, "back\\'slash": slashed}
    assert find_jobs(warehouse, OTHER, asked) == {"theirs": theirs, "archived-theirs": archived}
    assert find_jobs(warehouse, GROUP, []) == {}


def test_tables_not_created_yet_hold_nothing(warehouse: Warehouse, tmp_path: Path) -> None:
    nowhere = Warehouse.at(tmp_path / "no-warehouse")
    assert find_jobs(nowhere, GROUP, ["a", "b"]) == {}
    assert list(finished_ids_since(nowhere, GROUP, 0.0)) == []

    # Only `jobs` there: it answers alone.
    done = record("done", JobStatus.SUCCEEDED, T0, result=1)
    put_jobs(warehouse, GROUP, [done])
    shutil.rmtree(Path(warehouse.location) / t.JOBS_ARCHIVE)
    assert find_jobs(warehouse, GROUP, ["done", "gone"]) == {"done": done}
    assert all_ids(finished_ids_since(warehouse, GROUP, 0.0)) == ["done"]


def test_more_ids_than_one_query_takes(warehouse: Warehouse) -> None:
    archived = [
        record(f"arch-{n:05d}", JobStatus.SUCCEEDED, T0 + n, result=n, seq=n) for n in range(1234)
    ]
    archive(warehouse, GROUP, [(job, T0 + DAY) for job in archived])
    current = [record(f"cur-{n:05d}", JobStatus.QUEUED, T0 + n, seq=n) for n in range(300)]
    put_jobs(warehouse, GROUP, current)
    unknown = [f"none-{n}" for n in range(100)]
    asked = [job.id for job in archived] + [job.id for job in current] + unknown
    assert len(asked) > 3 * MAX_IDS_PER_QUERY

    found = find_jobs(warehouse, GROUP, asked + asked[:10])  # repeats are asked once

    assert found == {job.id: job for job in archived + current}


def test_finished_ids_since_yields_the_finished_ids_from_since_on(warehouse: Warehouse) -> None:
    since = T0 + DAY + 6 * HOUR  # 2027-01-16 14:00 UTC
    expected: list[str] = []

    def finished(prefix: str, count: int, status: JobStatus, at: float) -> list[JobRecord]:
        jobs = [record(f"{prefix}-{n}", status, at + n, result=n) for n in range(count)]
        if at >= since:
            expected.extend(job.id for job in jobs)
        return jobs

    put_jobs(
        warehouse,
        GROUP,
        [
            *finished("jobs-ok", 9, JobStatus.SUCCEEDED, since),  # `>=`: the first one at `since`
            *finished("jobs-cancelled", 4, JobStatus.CANCELLED, since + HOUR),
            *finished("jobs-expired", 3, JobStatus.EXPIRED, since + 2 * HOUR),
            *finished("jobs-old", 5, JobStatus.SUCCEEDED, since - 10.0),
            record("queued", JobStatus.QUEUED, since + 5.0),
            record("running", JobStatus.RUNNING, since + 5.0),
            record("dead", JobStatus.DEAD, since + 5.0),
        ],
    )
    put_jobs(warehouse, OTHER, [record("theirs", JobStatus.SUCCEEDED, since + 1.0, result=0)])
    # The archive over five days: before `since`'s day, its day before and after `since`,
    # the next days. One commit (one file) per day and group.
    for day_start, count in ((T0 - DAY, 6), (T0, 7), (T0 + 3 * DAY, 8)):
        lives = finished(f"arch-{day_start:.0f}", count, JobStatus.SUCCEEDED, day_start)
        archive(warehouse, GROUP, [(job, job.updated_at + 60.0) for job in lives])
    same_day = [
        *finished("arch-morning", 5, JobStatus.SUCCEEDED, since - 2 * HOUR),
        *finished("arch-evening", 6, JobStatus.CANCELLED, since + 2 * HOUR),
    ]
    archive(warehouse, GROUP, [(job, job.updated_at + 60.0) for job in same_day])
    next_day = finished("arch-next", 10, JobStatus.SUCCEEDED, since + DAY)
    archive(warehouse, GROUP, [(job, job.updated_at + 60.0) for job in next_day])
    archive(warehouse, OTHER, [(record("theirs-arch", JobStatus.SUCCEEDED, since + 5.0), since)])
    # A job with a finished life archived and another finished in `jobs`: once per life.
    life = record("twice", JobStatus.SUCCEEDED, since + 10.0, result="first")
    archive(warehouse, GROUP, [(life, since + 20.0)])
    put_jobs(warehouse, GROUP, [record("twice", JobStatus.SUCCEEDED, since + 30.0, result="2")])
    expected += ["twice", "twice"]
    assert len(expected) == 9 + 4 + 3 + 8 + 6 + 10 + 2

    batches = list(finished_ids_since(warehouse, GROUP, since, batch_rows=10))

    assert all_ids(batches) == sorted(expected)
    assert [len(batch) for batch in batches[:-1]] == [10] * (len(batches) - 1)
    assert 1 <= len(batches[-1]) <= 10
    assert len(batches) == math.ceil(len(expected) / 10)
    assert all(isinstance(job_id, str) for batch in batches for job_id, _ in batch)
    # Each with its finish time, at or after `since`.
    assert all(at >= since for batch in batches for _, at in batch)

    # The archive's days before `since`'s are not read: with their files gone from the disk
    # (the log still naming them) the answer is the same.
    before = (dt.datetime.fromtimestamp(since, dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    for folder in (Path(warehouse.location) / t.JOBS_ARCHIVE).glob("date=*"):
        if folder.name.removeprefix("date=") <= before:
            shutil.rmtree(folder)
    assert all_ids(finished_ids_since(warehouse, GROUP, since)) == sorted(expected)
    assert list(finished_ids_since(warehouse, GROUP, math.inf)) == []
    with pytest.raises(ValueError, match="batch_rows"):
        finished_ids_since(warehouse, GROUP, since, batch_rows=0)
    with pytest.raises(ValueError, match="NaN"):
        finished_ids_since(warehouse, GROUP, math.nan)


def test_finished_ids_since_from_the_beginning(warehouse: Warehouse) -> None:
    old = record("old", JobStatus.SUCCEEDED, 1.0, result=0)  # 1970
    put_jobs(warehouse, GROUP, [record("new", JobStatus.EXPIRED, T0)])
    archive(warehouse, GROUP, [(old, 2.0)])
    assert all_ids(finished_ids_since(warehouse, GROUP, -math.inf)) == ["new", "old"]
    assert all_ids(finished_ids_since(warehouse, GROUP, 0.0)) == ["new", "old"]
    assert all_ids(finished_ids_since(warehouse, GROUP, 1.5)) == ["new"]


APPENDS = 50
ROWS_PER_APPEND = 2000


def test_a_lookup_in_an_archive_of_many_files(warehouse: Warehouse) -> None:
    """50 appends of 2,000 lives with random ids (what clients choose): the right life is
    found in 100,000 rows. The times are printed for the record (`pytest -s`), not asserted."""
    lives: list[JobRecord] = []
    for append in range(APPENDS):
        # An hour of lives per append: the archive spans three days, as pruning writes it.
        at = T0 + append * HOUR
        batch = [
            record(uuid.uuid4().hex, JobStatus.SUCCEEDED, at + n * 1.0, result={"n": n}, seq=n)
            for n in range(ROWS_PER_APPEND)
        ]
        archive(warehouse, GROUP, [(job, at + HOUR) for job in batch])
        lives += batch
    files = len(warehouse.open(t.JOBS_ARCHIVE).file_uris())
    assert files >= APPENDS

    one = lives[len(lives) // 2 + 17]
    started = time.perf_counter()
    assert find_jobs(warehouse, GROUP, [one.id]) == {one.id: one}
    one_s = time.perf_counter() - started

    asked = lives[7 :: len(lives) // MAX_IDS_PER_QUERY][:MAX_IDS_PER_QUERY]
    assert len(asked) == MAX_IDS_PER_QUERY
    started = time.perf_counter()
    found = find_jobs(warehouse, GROUP, [job.id for job in asked])
    many_s = time.perf_counter() - started
    assert found == {job.id: job for job in asked}

    since = T0 + (APPENDS // 2) * HOUR
    started = time.perf_counter()
    ids = all_ids(finished_ids_since(warehouse, GROUP, since, batch_rows=8192))
    since_s = time.perf_counter() - started
    assert ids == sorted(job.id for job in lives if job.updated_at >= since)
    started = time.perf_counter()
    every = sum(len(batch) for batch in finished_ids_since(warehouse, GROUP, 0.0))
    every_s = time.perf_counter() - started
    assert every == len(lives)

    print(
        f"\njobs_archive: {len(lives)} rows in {files} files;"
        f" find_jobs 1 id {one_s * 1000:.0f} ms,"
        f" {MAX_IDS_PER_QUERY} ids {many_s * 1000:.0f} ms;"
        f" finished_ids_since {len(ids)} ids (half the days) {since_s * 1000:.0f} ms,"
        f" all {every} ids {every_s * 1000:.0f} ms ({every / every_s:,.0f} rows/s)"
    )

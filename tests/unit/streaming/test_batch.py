"""The checkpoint files the writer reads (the query id, the batch offsets), and its read of the
batch's touched jobs from `jobs` as delta-rs writes it; and hostile records (issue 13 item 7):
no record stops a batch, each is taken whole or lands in `rejected` with its reason."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch.core.events import Completed, Enqueued, LeaderElected, WorkerHeartbeat
from dispatch.core.job import JobRecord
from dispatch.delta import tables as t
from dispatch.delta.job_rows import JobKey, JobState, job_row, job_state
from dispatch.delta.progress import BATCH, Progress, latest_progress
from dispatch.delta.snapshot import latest_snapshot
from dispatch.event_records import decode_batch, encode_batch
from dispatch.storage import Location
from dispatch.streaming import guard
from dispatch.streaming.batch import BatchWriter, _Positions, batch_end_offsets, query_id
from dispatch.streaming.decode import KafkaRow, Topics
from dispatch.streaming.fold import archived_row
from dispatch.warehouse import Warehouse
from tests.unit.streaming.hostile import hostile_record
from tests.unit.streaming.workload import mixed_workload


def test_query_id_and_batch_offsets_come_from_the_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text(json.dumps({"id": "q-1"}) + "\n")
    assert query_id(Location.at(tmp_path)) == "q-1"
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "4").write_text(
        "v1\n"
        + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
        + "\n"
        + json.dumps({"ev": {"0": 12}, "sub": {"0": 3, "1": 5}})
    )
    assert batch_end_offsets(Location.at(tmp_path), 4) == {"ev": {0: 12}, "sub": {0: 3, 1: 5}}
    assert batch_end_offsets(Location.at(tmp_path), 5) is None


def queued(job_id: str, seq: int) -> JobRecord:
    return JobRecord(
        id=job_id, client_id="c", exec="e", payload={"n": seq}, max_attempts=3, timeout_s=30.0,
        submitted_at=1.0, updated_at=1.0, seq=seq,
    )  # fmt: skip


@pytest.mark.parametrize("cache_open_jobs", [True, False])
def test_a_batch_touching_60k_jobs_reads_their_rows_from_merged_files(
    tmp_path: Path, cache_open_jobs: bool
) -> None:
    """The touched jobs' rows are read from files delta-rs's MERGE wrote (string_view inside:
    no pyarrow pushdown) for a batch of tens of thousands of jobs (no huge SQL IN list: that
    crashed DataFusion at ~50k), through the cache of the open partition or not."""
    warehouse = Warehouse.at(tmp_path / "delta")
    rows = [job_row("g", JobState(queued(f"job-{n}", n))) for n in range(70_000)]
    path = warehouse.table(t.JOBS)
    write_deltalake(path, t.arrow_rows(t.JOBS, rows[:60_000]), partition_by=t.PARTITIONS[t.JOBS])
    merge = DeltaTable(path).merge(
        t.arrow_rows(t.JOBS, rows[50_000:]), "t.id = s.id", source_alias="s", target_alias="t"
    )
    merge.when_matched_update_all().when_not_matched_insert_all().execute()
    writer = BatchWriter(
        warehouse,
        Topics("s", "e", "r"),
        Location.at(tmp_path / "checkpoint"),
        cache_open_jobs=cache_open_jobs,
    )
    wanted = {("g", f"job-{n}") for n in range(0, 70_000, 7)} | {("g", "job-never")}
    wanted |= {("g", f"job-{n}") for n in range(10_000, 70_000)}
    current, unreadable, open_seqs = writer._current_jobs(wanted, include_closed=False)
    assert set(current) == wanted - {("g", "job-never")} and not unreadable
    assert current[("g", "job-65000")].record.payload == {"n": 65000}
    assert Counter(open_seqs) == Counter(state.record.seq for state in current.values())


# --- hostile records: skipped and recorded, never raised ---------------------------------------


WHEN = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
TOPICS = Topics("sub", "ev", "rej")


def events_rows_of(values: list[bytes | None]) -> list[KafkaRow]:
    return [
        KafkaRow("ev", 0, offset, b"default", value, WHEN) for offset, value in enumerate(values)
    ]


class InMemoryWriter(BatchWriter):
    """The writer's decode, fence and fold with no table: every job is new, nothing absorbed."""

    def __init__(self) -> None:
        super().__init__(Warehouse.at("/nonexistent"), TOPICS, Location.at("/nonexistent"))
        self._positions = _Positions({name: {} for name in t.SCHEMAS}, {})

    def _current_jobs(
        self, keys: set[JobKey], *, include_closed: bool
    ) -> tuple[dict[JobKey, JobState], dict[JobKey, str], list[int | None]]:
        return {}, {}, []


def all_rows_fit(writer: BatchWriter, rows: list[KafkaRow]) -> dict[str, Any]:
    """Plan the batch and build every table's Arrow rows as the writes would (raises if any
    does not fit its schema)."""
    plan = writer._plan(rows)
    end = {"ev": {0: len(rows)}}
    tables = {
        t.EVENTS: t.arrow_rows(t.EVENTS, writer.events_rows(0, plan)),
        t.REJECTED: t.arrow_rows(t.REJECTED, writer.rejected_rows(0, plan)),
        t.STATS_PARTIAL: t.arrow_rows(
            t.STATS_PARTIAL, writer.stats_partial_rows(0, end, plan.fold.stats.rows)
        ),
        t.JOBS: writer.jobs_source(plan.fold),
        t.JOBS_ARCHIVE: t.arrow_rows(
            t.JOBS_ARCHIVE, [archived_row(life) for life in plan.fold.archived]
        ),
    }
    return {"plan": plan, **tables}


def check_accounting(values: list[bytes | None], out: dict[str, Any]) -> None:
    """Every events record is either taken whole (each of its events has a clean `events`
    row) or has a `rejected` row, and a record has a `rejected` row exactly when one of its
    `events` rows carries an error."""
    events = out[t.EVENTS].to_pylist()
    rejected = {row["offset"]: row for row in out[t.REJECTED].to_pylist() if row["topic"] == "ev"}
    flagged = {row["offset"] for row in events if row["error"] is not None}
    assert flagged == set(rejected)
    for offset, value in enumerate(values):
        if offset in rejected:
            assert rejected[offset]["reason"]
            assert rejected[offset]["value"] == (
                None if value is None else value[: guard.MAX_KEPT_BYTES]
            )
            continue
        assert value is not None
        decoded = decode_batch(value)  # taken whole: it decodes
        rows = [row for row in events if row["offset"] == offset]
        assert [row["idx"] for row in rows] == list(range(len(decoded.events)))
        assert all(row["kind"] == "event" for row in rows)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(st.tuples(st.integers(0, 10_000), hostile_record()), min_size=1, max_size=6))
def test_no_hostile_record_stops_a_batch_and_each_is_taken_or_rejected(
    poison: list[tuple[int, bytes | None]],
) -> None:
    """Hostile records between the leader's: nothing escapes, every table's rows fit their
    Arrow schema, and each record is accounted for (taken whole, or in `rejected`)."""
    good: list[bytes | None] = [record.value() for record in GOOD.log]
    values = list(good)
    for position, value in poison:
        values.insert(position % (len(values) + 1), value)
    check_accounting(values, all_rows_fit(InMemoryWriter(), events_rows_of(values)))


GOOD = mixed_workload()


def poison_values() -> tuple[list[bytes | None], dict[int, str]]:
    """The leader's records with one poison of each kind between them; poison offset -> a
    word of its reason."""
    overflow = Enqueued(
        epoch=1, at=1_790_000_000.0, job_id="poison", client_id="alice", exec="image.resize",
        payload=None, max_attempts=2**31, timeout_s=30.0, seq=99,
    )  # fmt: skip
    ghost = Completed(
        epoch=1, at=1_790_000_000.0, job_id="ghost", worker_id="w", attempt=1, lease="x"
    )
    record = json.loads(encode_batch("default", 1, [overflow]))
    nan = dict(
        record, events=[dict(record["events"][0], job_id="nan", max_attempts=3, payload=math.nan)]
    )
    surrogate = dict(record, events=[dict(record["events"][0], job_id="\ud800", max_attempts=3)])
    poison: dict[int, tuple[bytes | None, str]] = {
        3: (encode_batch("default", 1, [overflow]), "max_attempts"),
        5: (b"\xff\xfe not JSON", "not JSON"),
        6: (None, "tombstone"),
        8: (encode_batch("default", 1, [ghost]), "unknown job"),
        9: (json.dumps(nan).encode(), "NaN"),
        11: (json.dumps(surrogate).encode(), "jobs.id"),
        12: (b'{"v":1,"group":"default","epoch":1,"events":[' + b"[" * 50_000, "too deeply"),
        14: (json.dumps(dict(record, epoch=2**63)).encode(), "epoch"),
    }
    values: list[bytes | None] = [record.value() for record in GOOD.log]
    for offset in sorted(poison):
        values.insert(offset, poison[offset][0])
    return values, {offset: word for offset, (_, word) in poison.items()}


def test_each_poison_is_rejected_with_its_reason_and_the_good_jobs_fold() -> None:
    values, poison = poison_values()
    out = all_rows_fit(InMemoryWriter(), events_rows_of(values))
    check_accounting(values, out)
    rejected = {row["offset"]: row for row in out[t.REJECTED].to_pylist()}
    assert set(rejected) == set(poison)
    for offset, word in poison.items():
        assert word in rejected[offset]["reason"], rejected[offset]["reason"]
        assert rejected[offset]["source_offset"] == offset
    jobs = {row["id"]: row for row in out[t.JOBS].to_pylist()}
    expected = GOOD.expected_jobs()
    assert set(jobs) == set(expected)
    for job_id, job in expected.items():
        assert job_state(jobs[job_id])[1].record.to_dict() == job


def create_empty_tables(warehouse: Warehouse) -> None:
    for name, schema in t.SCHEMAS.items():
        write_deltalake(
            warehouse.table(name),
            schema.empty_table(),
            partition_by=t.PARTITIONS[name] or None,
        )


def test_poison_batches_commit_and_a_replay_writes_nothing_twice(tmp_path: Path) -> None:
    """Through delta-rs, as the query writes (no Spark: the workload has no prune): the batch
    with the poison commits, its replay by the same writer and by a restarted one adds no
    row, and the next batch goes on."""
    warehouse = Warehouse.at(tmp_path / "delta")
    create_empty_tables(warehouse)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "q"}) + "\n")
    values, poison = poison_values()
    rows = events_rows_of(values)
    half = len(rows) // 2
    first, second = rows[:half], rows[half:]
    writer = BatchWriter(warehouse, TOPICS, Location.at(checkpoint))
    writer.write_batch(0, first, {"ev": {0: half}})
    counts = table_counts(warehouse)
    writer.write_batch(0, first, {"ev": {0: half}})
    BatchWriter(warehouse, TOPICS, Location.at(checkpoint)).write_batch(0, first, {"ev": {0: half}})
    assert table_counts(warehouse) == counts
    BatchWriter(warehouse, TOPICS, Location.at(checkpoint)).write_batch(
        1, second, {"ev": {0: len(rows)}}
    )
    rejected = warehouse.open(t.REJECTED).to_pyarrow_table().to_pylist()
    assert sorted(row["offset"] for row in rejected) == sorted(poison)
    jobs = warehouse.open(t.JOBS).to_pyarrow_table().to_pylist()
    assert {job_state(row)[1].record.id: job_state(row)[1].record.to_dict() for row in jobs} == (
        GOOD.expected_jobs()
    )


def table_counts(warehouse: Warehouse) -> dict[str, int]:
    return {name: warehouse.open(name).to_pyarrow_table().num_rows for name in t.SCHEMAS}


def test_every_batch_commits_jobs_with_its_progress_even_when_no_job_changed(
    tmp_path: Path,
) -> None:
    """delta-rs makes no commit for a MERGE that writes nothing (an empty source, or rows that
    match and insert nothing): a batch of worker heartbeats only, or of submit records only,
    must still commit `jobs` with its progress, so the snapshot pointer, the fence epochs and
    the lag move with the log (a chaos run: 300+ heartbeat batches, `jobs` stuck at batch 2)."""
    warehouse = Warehouse.at(tmp_path / "delta")
    create_empty_tables(warehouse)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "q"}) + "\n")
    epoch = GOOD.log[-1].epoch
    heartbeat = encode_batch(
        "default", epoch, [WorkerHeartbeat(epoch=epoch, at=2e9, worker_id="w")]
    )
    elected = encode_batch("default", epoch + 1, [LeaderElected(epoch=epoch + 1, at=2e9)])
    good = [record.value() for record in GOOD.log]
    half = len(good) // 2
    values: list[bytes | None] = [*good[:half], heartbeat, *good[half:], elected]
    events = events_rows_of(values)
    submits = [
        KafkaRow("sub", 0, offset, key, value, WHEN)
        for offset, (key, value) in enumerate(GOOD.submits[:3])
    ]
    # (rows, end): job changes; a heartbeat; submits only; job changes; a new leader.
    batches = [
        (events[:half], {"ev": {0: half}}),
        (events[half : half + 1], {"ev": {0: half + 1}}),
        (submits, {"ev": {0: half + 1}, "sub": {0: 3}}),
        (events[half + 1 : -1], {"ev": {0: len(values) - 1}, "sub": {0: 3}}),
        (events[-1:], {"ev": {0: len(values)}, "sub": {0: 3}}),
    ]
    jobs_path = warehouse.table(t.JOBS)
    writer = BatchWriter(warehouse, TOPICS, Location.at(checkpoint))
    states: list[dict[str, dict[str, Any]]] = []
    for batch_id, (rows, end) in enumerate(batches):
        writer.write_batch(batch_id, rows, end)
        committed = latest_progress(warehouse, t.JOBS, BATCH)
        assert committed is not None
        assert (committed.progress.batch_id, committed.progress.offsets) == (batch_id, end)
        assert committed.progress.fence == writer.positions().fence
        snapshot = latest_snapshot(warehouse)
        assert snapshot is not None
        assert (snapshot.batch_id, snapshot.offsets) == (batch_id, end["ev"])
        assert snapshot.version == committed.version == DeltaTable(jobs_path).version()
        states.append({job.id: job.to_dict() for job in snapshot.jobs})
    # The commits with no data read as the state before them.
    assert states[0] == states[1] == states[2] != states[3] == states[4] == GOOD.expected_jobs()
    batch_commits = [
        progress.batch_id
        for commit in DeltaTable(jobs_path).history()
        if (progress := Progress.from_json(commit.get("userMetadata"))) is not None
    ]
    assert batch_commits == [4, 3, 2, 1, 0]
    assert snapshot is not None
    assert snapshot.fence_epoch == epoch + 1
    # A replayed empty batch is skipped like any other: no second commit.
    version = DeltaTable(jobs_path).version()
    BatchWriter(warehouse, TOPICS, Location.at(checkpoint)).write_batch(
        4, events[-1:], batches[-1][1]
    )
    assert DeltaTable(jobs_path).version() == version

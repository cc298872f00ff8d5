"""The checkpoint files the writer reads (the query id, the batch offsets), and its read of the
batch's touched jobs from `jobs` as delta-rs writes it."""

from __future__ import annotations

import json
from pathlib import Path

from deltalake import DeltaTable, write_deltalake

from dispatch.core.job import JobRecord
from streaming import tables as t
from streaming.batch import BatchWriter, batch_end_offsets, query_id
from streaming.decode import Topics
from streaming.fold import JobState, job_row


def test_query_id_and_batch_offsets_come_from_the_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text(json.dumps({"id": "q-1"}) + "\n")
    assert query_id(tmp_path) == "q-1"
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "4").write_text(
        "v1\n"
        + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
        + "\n"
        + json.dumps({"ev": {"0": 12}, "sub": {"0": 3, "1": 5}})
    )
    assert batch_end_offsets(tmp_path, 4) == {"ev": {0: 12}, "sub": {0: 3, 1: 5}}
    assert batch_end_offsets(tmp_path, 5) is None


def queued(job_id: str, seq: int) -> JobRecord:
    return JobRecord(
        id=job_id, client_id="c", exec="e", payload={"n": seq}, max_attempts=3, timeout_s=30.0,
        submitted_at=1.0, updated_at=1.0, seq=seq,
    )  # fmt: skip


def test_a_batch_touching_60k_jobs_reads_their_rows_from_merged_files(tmp_path: Path) -> None:
    """The touched jobs' rows are read from files delta-rs's MERGE wrote (string_view inside:
    no pyarrow pushdown) for a batch of tens of thousands of jobs (no huge SQL IN list: that
    crashed DataFusion at ~50k)."""
    warehouse = tmp_path / "delta"
    rows = [job_row("g", JobState(queued(f"job-{n}", n))) for n in range(70_000)]
    path = t.table_path(warehouse, t.JOBS)
    write_deltalake(path, t.arrow_rows(t.JOBS, rows[:60_000]), partition_by=t.PARTITIONS[t.JOBS])
    merge = DeltaTable(path).merge(
        t.arrow_rows(t.JOBS, rows[50_000:]), "t.id = s.id", source_alias="s", target_alias="t"
    )
    merge.when_matched_update_all().when_not_matched_insert_all().execute()
    writer = BatchWriter(warehouse, Topics("s", "e", "r"), tmp_path / "checkpoint")
    wanted = {("g", f"job-{n}") for n in range(0, 70_000, 7)} | {("g", "job-never")}
    wanted |= {("g", f"job-{n}") for n in range(10_000, 70_000)}
    current = writer._current_jobs(wanted, include_closed=False)
    assert set(current) == wanted - {("g", "job-never")}
    assert current[("g", "job-65000")].record.payload == {"n": 65000}

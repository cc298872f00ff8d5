"""`latest_snapshot` on a jobs table written with delta-rs (no Spark needed)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, write_deltalake

from dispatch.core.events import LimitRemoved, LimitSet, Paused, PauseScope, Resumed
from dispatch.core.job import JobRecord, JobStatus
from dispatch.core.limits import LimitScope
from dispatch.core.retry import RetryPolicy
from dispatch.delta import tables as t
from dispatch.delta.job_rows import JobState, job_row, job_state, records_from_arrow
from dispatch.delta.limits import LimitRows, apply_limits, arrow_limits, limits_at
from dispatch.delta.pauses import PauseRows, apply_pauses, arrow_pauses, pauses_at, pauses_version
from dispatch.delta.progress import BATCH, PRUNE, Progress
from dispatch.delta.snapshot import latest_snapshot
from dispatch.warehouse import Warehouse


def record(job_id: str, status: JobStatus = JobStatus.QUEUED) -> JobRecord:
    job = JobRecord(
        id=job_id,
        client_id="c",
        exec="a.b",
        payload={"p": 1},
        max_attempts=3,
        timeout_s=5.0,
        submitted_at=1.0,
        updated_at=2.0,
        seq=1,
    )
    job.status = status
    return job


def commit(warehouse: Path, rows: list[JobRecord], group: str, metadata: Progress | None) -> None:
    table = t.arrow_rows(t.JOBS, [job_row(group, JobState(job)) for job in rows])
    custom = {"userMetadata": metadata.to_json()} if metadata else None
    write_deltalake(
        Warehouse.at(warehouse).table(t.JOBS),
        table,
        mode="append",
        partition_by=t.PARTITIONS[t.JOBS],
        commit_properties=CommitProperties(custom_metadata=custom),
    )


def progress(batch: int, kind: str = BATCH) -> Progress:
    return Progress(
        app_id="app",
        batch_id=batch,
        kind=kind,
        offsets={"ev": {0: 40 + batch}, "sub": {0: 3}},
        topics={"events": "ev", "submit": "sub"},
        fence={"g": 4},
    )


def test_the_snapshot_is_the_last_batch_commit_of_the_group(tmp_path: Path) -> None:
    commit(tmp_path, [record("a"), record("b", JobStatus.CANCELLED)], "g", progress(0))
    commit(tmp_path, [record("other")], "h", progress(1))
    commit(tmp_path, [], "g", None)  # a maintenance commit
    commit(tmp_path, [record("late")], "g", progress(2, PRUNE))  # not a batch end
    snapshot = latest_snapshot(Warehouse.at(tmp_path), "g")
    assert snapshot is not None
    assert snapshot.version == 1 and snapshot.batch_id == 1
    assert sorted(snapshot.jobs, key=lambda job: job.id) == [
        record("a"),
        record("b", JobStatus.CANCELLED),
    ]
    assert snapshot.jobs[0].payload == {"p": 1}
    assert snapshot.events_topic == "ev" and snapshot.offsets == {0: 41}
    assert snapshot.fence_epoch == 4 and snapshot.app_id == "app"
    other = latest_snapshot(Warehouse.at(tmp_path), "h")
    assert other is not None and [job.id for job in other.jobs] == ["other"]
    assert other.fence_epoch == 0


def test_no_snapshot_without_a_batch_commit(tmp_path: Path) -> None:
    assert latest_snapshot(Warehouse.at(tmp_path), "g") is None
    commit(tmp_path, [record("a")], "g", None)
    assert latest_snapshot(Warehouse.at(tmp_path), "g") is None


def test_each_snapshot_reads_records_of_its_own(tmp_path: Path) -> None:
    # A leader's restore takes them (owned=True) and mutates them.
    commit(tmp_path, [record("a"), record("b", JobStatus.CANCELLED)], "g", progress(0))
    warehouse = Warehouse.at(tmp_path)
    first, second = latest_snapshot(warehouse, "g"), latest_snapshot(warehouse, "g")
    assert first is not None and second is not None and first.jobs == second.jobs
    assert not {id(job) for job in first.jobs} & {id(job) for job in second.jobs}
    assert not {id(job.payload) for job in first.jobs} & {id(job.payload) for job in second.jobs}


def test_a_job_s_retry_policy_and_expiry_survive_the_snapshot(tmp_path: Path) -> None:
    """A new leader rebuilds a job's own retry policy and its expiry from `jobs`."""
    own = record("a")
    own.retry = RetryPolicy(delay_s=5.0, multiplier=3.0, max_delay_s=90.0, jitter=0.25)
    own.expires_at = 500.0
    commit(tmp_path, [own, record("b")], "g", progress(0))
    snapshot = latest_snapshot(Warehouse.at(tmp_path), "g")
    assert snapshot is not None
    assert sorted(snapshot.jobs, key=lambda job: job.id) == [own, record("b")]


def test_a_table_from_before_the_new_columns_still_gives_a_snapshot(tmp_path: Path) -> None:
    """A `jobs` table the fold has not yet given its later columns (`retry`, `expires_at`,
    `max_run_s`, `run_limit_at`, `cancel_requested_at`: it adds them as it starts) reads as
    jobs without them."""
    rows = [job_row("g", JobState(record("a")))]
    later = (
        "retry", "expires_at", "max_run_s", "run_limit_at", "cancel_requested_at", "progress",
        "key",
    )  # fmt: skip
    for row in rows:
        for name in later:
            del row[name]
    old_schema = pa.schema([f for f in t.SCHEMAS[t.JOBS] if f.name not in later])
    write_deltalake(
        Warehouse.at(tmp_path).table(t.JOBS),
        pa.Table.from_pylist(rows, schema=old_schema),
        mode="append",
        partition_by=t.PARTITIONS[t.JOBS],
        commit_properties=CommitProperties(custom_metadata={"userMetadata": progress(0).to_json()}),
    )
    snapshot = latest_snapshot(Warehouse.at(tmp_path), "g")
    assert snapshot is not None and snapshot.jobs == [record("a")]


def test_a_running_job_s_time_limit_and_cancel_survive_the_snapshot(tmp_path: Path) -> None:
    """A new leader rebuilds a running job's limit and a pending cancel from `jobs`."""
    running = record("a", JobStatus.RUNNING)
    running.attempts, running.worker_id, running.lease, running.deadline = 1, "w", "l", 20.0
    running.max_run_s, running.run_limit_at, running.cancel_requested_at = 30.0, 32.0, 15.0
    limited = record("b")
    limited.max_run_s = 30.0
    commit(tmp_path, [running, limited, record("c")], "g", progress(0))
    snapshot = latest_snapshot(Warehouse.at(tmp_path), "g")
    assert snapshot is not None
    assert sorted(snapshot.jobs, key=lambda job: job.id) == [running, limited, record("c")]
    row = job_row("g", JobState(record("c")))
    assert (row["max_run_s"], row["run_limit_at"], row["cancel_requested_at"]) == (None,) * 3


def test_a_job_s_progress_survives_the_snapshot_and_is_checked(tmp_path: Path) -> None:
    """`progress` is JSON text in `jobs`; both readers give the report back, validated."""
    running = record("a", JobStatus.RUNNING)
    running.attempts, running.worker_id, running.lease, running.deadline = 1, "w", "l", 20.0
    running.progress = {"done": 3.0, "total": None, "message": "half é", "at": 12.5}
    commit(tmp_path, [running, record("b")], "g", progress(0))
    snapshot = latest_snapshot(Warehouse.at(tmp_path), "g")
    assert snapshot is not None
    assert sorted(snapshot.jobs, key=lambda job: job.id) == [running, record("b")]
    row = job_row("g", JobState(running))
    assert row["progress"] == '{"done":3.0,"total":null,"message":"half \\u00e9","at":12.5}'
    assert job_state(row)[1].record == running
    assert job_row("g", JobState(record("b")))["progress"] is None
    row["progress"] = '{"done":-1,"at":1.0}'
    with pytest.raises(ValueError, match=r"progress\.done"):
        job_state(row)
    with pytest.raises(ValueError, match=r"progress\.done"):
        records_from_arrow(t.arrow_rows(t.JOBS, [row]))


def paused(at: float, target: str, scope: PauseScope = PauseScope.EXEC) -> Paused:
    return Paused(epoch=4, at=at, scope=scope, target=target, by="ops", reason=f"r{at}")


def write_pauses(warehouse: Path, rows: PauseRows, offset: int) -> None:
    metadata = Progress(
        app_id="app", batch_id=offset, kind=BATCH, offsets={"ev": {0: offset}},
        topics={"events": "ev"},
    )  # fmt: skip
    write_deltalake(
        Warehouse.at(warehouse).table(t.PAUSES),
        arrow_pauses(rows),
        mode="overwrite",
        commit_properties=CommitProperties(custom_metadata={"userMetadata": metadata.to_json()}),
    )


def test_the_snapshot_holds_the_pauses_in_force_at_its_offsets(tmp_path: Path) -> None:
    """The newest `pauses` version at or before the snapshot's offsets: one a batch wrote
    before failing to commit `jobs` (past them) is not taken."""
    rows: PauseRows = {}
    apply_pauses(rows, [("g", paused(1.0, "a.>")), ("h", paused(1.5, "x"))])
    write_pauses(tmp_path, rows, 30)
    apply_pauses(rows, [("g", paused(2.0, "acme", PauseScope.CLIENT))])
    write_pauses(tmp_path, rows, 38)
    apply_pauses(
        rows,
        [
            ("g", Resumed(epoch=4, at=3.0, scope=PauseScope.EXEC, target="a.>")),
            ("g", paused(4, "b")),
        ],
    )
    write_pauses(tmp_path, rows, 45)  # a failed batch's: jobs covers 41 only
    commit(tmp_path, [record("a")], "g", progress(1))
    snapshot = latest_snapshot(Warehouse.at(tmp_path), "g")
    assert snapshot is not None and snapshot.offsets == {0: 41}
    assert snapshot.pauses == [paused(1.0, "a.>"), paused(2.0, "acme", PauseScope.CLIENT)]
    assert set(pauses_at(Warehouse.at(tmp_path), "ev", {0: 45})) == {
        ("g", "client", "acme"), ("g", "exec", "b"), ("h", "exec", "x"),
    }  # fmt: skip
    assert pauses_at(Warehouse.at(tmp_path), "ev", {0: 29}) == {}
    assert pauses_at(Warehouse.at(tmp_path / "none"), "ev", {0: 45}) == {}


def test_pauses_are_read_at_the_latest_version_after_maintenance(tmp_path: Path) -> None:
    """Only maintenance after the batch's version: its rows are read from the latest version
    (whose files VACUUM keeps), not from the batch's."""
    rows: PauseRows = {}
    apply_pauses(rows, [("g", paused(1.0, "a.>"))])
    write_pauses(tmp_path, rows, 30)
    apply_pauses(rows, [("g", paused(2.0, "b"))])
    write_pauses(tmp_path, rows, 31)
    table = Warehouse.at(tmp_path).open(t.PAUSES)
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 30 days"})
    table = Warehouse.at(tmp_path).open(t.PAUSES)
    assert pauses_version(table, "ev", {0: 40}) == table.version() == 2
    assert pauses_version(table, "ev", {0: 30}) == 0
    assert set(pauses_at(Warehouse.at(tmp_path), "ev", {0: 40})) == {
        ("g", "exec", "a.>"), ("g", "exec", "b"),
    }  # fmt: skip


def test_a_job_s_key_survives_the_snapshot(tmp_path: Path) -> None:
    keyed = record("a")
    keyed.key = "account:42"
    commit(tmp_path, [keyed, record("b")], "g", progress(0))
    snapshot = latest_snapshot(Warehouse.at(tmp_path), "g")
    assert snapshot is not None
    assert sorted(snapshot.jobs, key=lambda job: job.id) == [keyed, record("b")]
    row = job_row("g", JobState(keyed))
    assert row["key"] == "account:42"
    assert job_state(row)[1].record == keyed
    assert job_row("g", JobState(record("b")))["key"] is None
    row["key"] = "a*"
    with pytest.raises(ValueError, match="key"):
        job_state(row)


def limit_set(
    at: float,
    target: str,
    scope: LimitScope = LimitScope.CLIENT,
    *,
    max_inflight: int | None = 3,
    rate: float | None = None,
    burst: int | None = None,
) -> LimitSet:
    return LimitSet(
        epoch=4, at=at, scope=scope, target=target, max_inflight=max_inflight, rate=rate,
        burst=burst, by="ops", reason=f"r{at}",
    )  # fmt: skip


def write_limits(warehouse: Path, rows: LimitRows, offset: int) -> None:
    metadata = Progress(
        app_id="app", batch_id=offset, kind=BATCH, offsets={"ev": {0: offset}},
        topics={"events": "ev"},
    )  # fmt: skip
    write_deltalake(
        Warehouse.at(warehouse).table(t.LIMITS),
        arrow_limits(rows),
        mode="overwrite",
        commit_properties=CommitProperties(custom_metadata={"userMetadata": metadata.to_json()}),
    )


def test_the_snapshot_holds_the_runtime_limits_in_force_at_its_offsets(tmp_path: Path) -> None:
    """The newest `limits` version at or before the snapshot's offsets (one a batch wrote
    before failing to commit `jobs` is past them, not taken), knobs as they were set."""
    rows: LimitRows = {}
    apply_limits(
        rows,
        [
            ("g", limit_set(1.0, "acme", rate=50.0, burst=100, max_inflight=10)),
            ("h", limit_set(1.5, "acme")),
            ("g", limit_set(1.7, "image.>", LimitScope.EXEC, max_inflight=4)),
        ],
    )
    write_limits(tmp_path, rows, 30)
    apply_limits(
        rows,
        [("g", limit_set(2.0, "account:*", LimitScope.KEY, max_inflight=None, rate=2.5, burst=3))],
    )
    write_limits(tmp_path, rows, 38)
    apply_limits(
        rows,
        [
            ("g", LimitRemoved(epoch=4, at=3.0, scope=LimitScope.CLIENT, target="acme")),
            ("g", limit_set(4, "image.>", LimitScope.EXEC, max_inflight=8)),
        ],
    )
    write_limits(tmp_path, rows, 45)  # a failed batch's: jobs covers 41 only
    commit(tmp_path, [record("a")], "g", progress(1))
    snapshot = latest_snapshot(Warehouse.at(tmp_path), "g")
    assert snapshot is not None and snapshot.offsets == {0: 41}
    assert snapshot.limits == [
        limit_set(1.0, "acme", rate=50.0, burst=100, max_inflight=10),
        limit_set(1.7, "image.>", LimitScope.EXEC, max_inflight=4),
        limit_set(2.0, "account:*", LimitScope.KEY, max_inflight=None, rate=2.5, burst=3),
    ]
    assert snapshot.pauses == []
    latest = limits_at(Warehouse.at(tmp_path), "ev", {0: 45})
    assert set(latest) == {
        ("g", "exec", "image.>"), ("g", "key", "account:*"), ("h", "client", "acme"),
    }  # fmt: skip
    assert latest["g", "exec", "image.>"]["max_inflight"] == 8
    assert latest["g", "key", "account:*"]["max_inflight"] is None
    assert limits_at(Warehouse.at(tmp_path), "ev", {0: 29}) == {}
    assert limits_at(Warehouse.at(tmp_path / "none"), "ev", {0: 45}) == {}

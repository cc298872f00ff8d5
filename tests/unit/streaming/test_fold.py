"""The batch fold against the dispatcher core: any batching of the log gives the leader's jobs."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from dispatch.core.commands import SubmitRequest
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Assigned, Completed, Enqueued, Event
from dispatch.core.job import JobStatus
from dispatch.delta.job_rows import CLOSED, OPEN, JobKey, JobState, job_row, job_state
from dispatch.streaming.decode import LoggedEvent
from dispatch.streaming.fold import (
    BatchFold,
    archived_row,
    fence_batch,
    fold_batch,
    prune_groups,
    touched_jobs,
)
from tests.unit.streaming.workload import CONFIG, GROUP, Workload, mixed_workload, random_workload

FoldFunction = Callable[[list[LoggedEvent], list[bool], dict[JobKey, JobState]], BatchFold]


class Tables:
    """The `jobs` / `jobs_archive` semantics of the Spark writer, in memory."""

    def __init__(self, fold: FoldFunction = fold_batch) -> None:
        self.fold_function = fold
        """How a batch is folded: the driver's `fold_batch`, or a test's stand-in for it."""
        self.jobs: dict[JobKey, dict[str, Any]] = {}
        self.archive: list[dict[str, Any]] = []
        self.fence: dict[str, int] = {}
        self.offset = 0

    def fold(self, events: list[LoggedEvent]) -> None:
        admitted, self.fence = fence_batch(events, self.fence)
        touched = touched_jobs(events, admitted)
        pruning = bool(prune_groups(events, admitted))
        current: dict[JobKey, JobState] = {}
        for key in touched:
            row = self.jobs.get(key)
            if row is not None and (pruning or row["part"] == OPEN):
                current[key] = job_state(row)[1]
        result = self.fold_function(events, admitted, current)
        # Untouched closed rows: the first prune covering them archives them.
        for group, steps in result.prunes.items():
            for key, row in list(self.jobs.items()):
                if key[0] != group or key in touched or row["part"] != CLOSED:
                    continue
                for step in steps:
                    if row["updated_at"] <= step.before:
                        archived = dict(row)
                        del archived["part"]
                        archived["archived_at"] = step.at
                        self.archive.append(archived)
                        del self.jobs[key]
                        break
        for life in result.archived:
            self.archive.append(archived_row(life))
        for key, state in result.final.items():
            if state is None:
                self.jobs.pop(key, None)
            else:
                self.jobs[key] = job_row(key[0], state)

    def records(self) -> dict[str, dict[str, Any]]:
        return {key[1]: job_state(row)[1].record.to_dict() for key, row in self.jobs.items()}


def logged_events(workload: Workload) -> list[LoggedEvent]:
    out = []
    for offset, record in enumerate(workload.log):
        for index, event in enumerate(record.events):
            out.append(LoggedEvent(0, offset, index, GROUP, record.epoch, event))
    return out


def fold_in_batches(
    workload: Workload, rng: random.Random, max_batch: int, tables: Tables | None = None
) -> Tables:
    events = logged_events(workload)
    tables = Tables() if tables is None else tables
    position = 0
    while position < len(events):
        # Batches end at record boundaries, as Kafka micro-batches do.
        size = rng.randint(1, max_batch)
        end = min(len(events), position + size)
        while end < len(events) and events[end].offset == events[end - 1].offset:
            end += 1
        tables.fold(events[position:end])
        position = end
    return tables


@pytest.mark.parametrize("prune", [False, True])
@pytest.mark.parametrize("max_batch", [1, 7, 10_000])
def test_mixed_workload_gives_the_leaders_jobs(prune: bool, max_batch: int) -> None:
    workload = mixed_workload(prune=prune)
    tables = fold_in_batches(workload, random.Random(max_batch), max_batch)
    assert tables.records() == workload.expected_jobs()
    assert tables.fence == {GROUP: 2}


@pytest.mark.parametrize("seed", range(12))
def test_random_workloads_give_the_leaders_jobs(seed: int) -> None:
    workload = random_workload(seed)
    tables = fold_in_batches(workload, random.Random(seed), 1 + seed * 5)
    assert tables.records() == workload.expected_jobs()
    assert tables.fence == {GROUP: workload.leader.epoch}


def test_a_restored_leader_equals_the_live_one_at_any_snapshot() -> None:
    """jobs at batch N + the log after N, replayed into `Dispatcher.restore`, is the leader."""
    workload = random_workload(99, steps=400)
    events = logged_events(workload)
    expected = workload.expected_jobs()
    for start in (len(events) // 3, len(events) // 2, len(events) - 5):
        cut = start
        while cut < len(events) and events[cut].offset == events[cut - 1].offset:
            cut += 1
        tables = Tables()
        tables.fold(events[:cut])
        records = [job_state(row)[1].record for row in tables.jobs.values()]
        restored = Dispatcher.restore(records, config=CONFIG, epoch=tables.fence[GROUP])
        restored.apply_all(logged.event for logged in events[cut:])
        assert {job.id: job.to_dict() for job in restored.jobs()} == expected


def test_pruned_lives_are_archived_and_a_new_life_replaces_them() -> None:
    workload = mixed_workload(prune=True)
    tables = fold_in_batches(workload, random.Random(1), 5)
    archived_ids = [row["id"] for row in tables.archive]
    assert archived_ids, "the prune archived nothing"
    assert all(row["status"] in ("succeeded", "cancelled") for row in tables.archive)
    resubmitted = [job_id for job_id in archived_ids if (GROUP, job_id) in tables.jobs]
    assert resubmitted, "the pruned id submitted again is missing"
    assert tables.jobs[(GROUP, resubmitted[0])]["client_id"] == "dave"


def test_stale_epoch_events_are_ignored() -> None:
    workload = mixed_workload()
    events = logged_events(workload)
    admitted, fence = fence_batch(events, {})
    void = [logged for logged, ok in zip(events, admitted, strict=True) if not ok]
    assert void and all(logged.event.epoch == 1 for logged in void)
    assert fence == {GROUP: 2}
    # Seeded with the persisted epoch, a later batch ignores the zombie as well.
    later, _ = fence_batch(void, {GROUP: 2})
    assert not any(later)


def test_statistics_count_each_event_once_and_measure_latencies() -> None:
    core = Dispatcher(CONFIG)
    now = 1_800_000_000.0
    log: list[Event] = []
    log += core.begin_epoch(1, now)
    log += core.join("w", ["job.assign.>"], now)
    log += core.submit(SubmitRequest(id="j", exec="a.b", payload=1, client_id="c"), now + 1)
    log += core.grant_credit("w", 1, now + 4)
    assigned = next(e for e in log if isinstance(e, Assigned))
    log += core.ack("j", 1, assigned.lease, now + 10, result="r")
    events = [LoggedEvent(0, i, 0, GROUP, 1, e) for i, e in enumerate(log)]
    admitted, _ = fence_batch(events, {})
    result = fold_batch(events, admitted, {})
    (row,) = result.stats.rows.values()
    assert row.counters["submitted"] == 1
    assert row.counters["started"] == 1
    assert row.counters["completed"] == 1
    assert row.counters["retries"] == 0
    assert row.queue_wait.count == 1 and row.queue_wait.total == pytest.approx(3.0)
    assert row.run_time.count == 1 and row.run_time.total == pytest.approx(6.0)
    # Events the stats already hold (a replayed batch) are not counted again.
    again = fold_batch(events, admitted, {}, count_stats=lambda event: event.offset > 4)
    (row,) = again.stats.rows.values()
    assert row.counters["submitted"] == 0 and row.counters["started"] == 0
    assert row.counters["completed"] == 1
    assert row.queue_wait.count == 0 and row.run_time.count == 1


def test_an_event_that_does_not_fit_is_refused_and_the_fold_goes_on() -> None:
    """A `completed` for a job that does not exist (a hostile producer's record) used to
    stop the query for good (FoldError); it is refused, the other jobs fold."""
    ghost = Completed(epoch=1, at=1.0, job_id="ghost", worker_id="w", attempt=1, lease="1.1")
    fine = enqueued_event("fine", at=2.0)
    events = [LoggedEvent(0, 42, 0, GROUP, 1, ghost), LoggedEvent(0, 43, 0, GROUP, 1, fine)]
    result = fold_batch(events, [True, True], {})
    [refused] = result.refused
    assert refused.logged is events[0] and "unknown job" in refused.reason
    assert set(result.final) == {(GROUP, "fine")}
    assert (
        result.stats.rows and sum(r.counters["completed"] for r in result.stats.rows.values()) == 0
    )


def enqueued_event(job_id: str, *, at: float = 1.0, **fields: Any) -> Enqueued:
    values: dict[str, Any] = {
        "epoch": 1, "at": at, "job_id": job_id, "client_id": "c", "exec": "a.b",
        "payload": None, "max_attempts": 3, "timeout_s": 30.0, "seq": 1,
    }  # fmt: skip
    values.update(fields)
    return Enqueued(**values)


def test_a_refused_event_leaves_its_job_as_it_was_and_the_next_one_applies() -> None:
    """An `assigned` for a job that is gone is refused (so is the job's next event, which
    does not fit either); in a job that exists, a stale attempt is refused and the right one
    applies; the statistics count only applied events."""
    orphan = Assigned(
        epoch=1, at=2.0, job_id="orphan", worker_id="w", attempt=1, lease="l", deadline=9.0
    )
    orphan_done = Completed(epoch=1, at=2.5, job_id="orphan", worker_id="w", attempt=1, lease="l")
    fine = enqueued_event("fine", at=3.0, seq=2)
    events = [LoggedEvent(0, n, 0, GROUP, 1, e) for n, e in enumerate([orphan, orphan_done, fine])]
    result = fold_batch(events, [True] * 3, {})
    assert [r.logged.offset for r in result.refused] == [0, 1]
    assert all("unknown job" in r.reason for r in result.refused)
    assert set(result.final) == {(GROUP, "fine")}
    assert sum(r.counters["submitted"] for r in result.stats.rows.values()) == 1
    assert sum(r.counters["started"] for r in result.stats.rows.values()) == 0

    folded = result.final[(GROUP, "fine")]
    assert folded is not None
    stale = Assigned(
        epoch=1, at=4.0, job_id="fine", worker_id="w", attempt=2, lease="l", deadline=9.0
    )
    good = Assigned(
        epoch=1, at=5.0, job_id="fine", worker_id="w", attempt=1, lease="l", deadline=9.0
    )
    later = [LoggedEvent(0, 10, 0, GROUP, 1, stale), LoggedEvent(0, 11, 0, GROUP, 1, good)]
    result = fold_batch(later, [True, True], {(GROUP, "fine"): folded})
    assert [r.logged.offset for r in result.refused] == [10]
    final = result.final[(GROUP, "fine")]
    assert final is not None and final.record.attempts == 1 and final.started_at == 5.0
    assert folded.record.attempts == 0, "the pre-batch state is never mutated"
    assert sum(r.counters["started"] for r in result.stats.rows.values()) == 1


def test_a_job_whose_row_does_not_read_back_has_its_events_refused() -> None:
    events = [LoggedEvent(0, 7, 0, GROUP, 1, enqueued_event("old"))]
    result = fold_batch(events, [True], {}, unreadable={(GROUP, "old"): "bad payload"})
    assert [r.reason for r in result.refused] == ["its jobs row does not read back: bad payload"]
    assert not result.final


def test_rows_round_trip_through_the_table_format() -> None:
    event = Enqueued(
        epoch=1,
        at=5.0,
        job_id="j",
        client_id="c",
        exec="a.b",
        payload={"x": [1, 2.5, None]},
        max_attempts=2,
        timeout_s=3.0,
        seq=1,
    )
    result = fold_batch([LoggedEvent(0, 0, 0, GROUP, 1, event)], [True], {})
    state = result.final[(GROUP, "j")]
    assert state is not None and state.record.status is JobStatus.QUEUED
    row = job_row(GROUP, state)
    assert row["payload"] == '{"x":[1,2.5,null]}' and row["part"] == OPEN
    key, back = job_state(row)
    assert key == (GROUP, "j") and back == state


def test_the_columnar_reader_equals_the_validating_one() -> None:
    import pyarrow as pa

    from dispatch.delta import tables as t
    from dispatch.delta.job_rows import record_from_row, records_from_arrow

    tables = fold_in_batches(random_workload(5), random.Random(5), 50)
    rows = list(tables.jobs.values())
    table = pa.Table.from_pylist(rows, schema=t.SCHEMAS[t.JOBS])
    assert records_from_arrow(table) == [record_from_row(row) for row in rows]
    assert {job.status for job in records_from_arrow(table)} >= {JobStatus.DEAD}


def columnar_rows() -> list[dict[str, Any]]:
    return list(fold_in_batches(random_workload(5), random.Random(5), 50).jobs.values())


def test_the_columnar_reader_reads_chunked_columns_and_nulls_as_the_validating_one() -> None:
    import pyarrow as pa

    from dispatch.delta import tables as t
    from dispatch.delta.job_rows import record_from_row, records_from_arrow

    rows = columnar_rows()
    rows[0] = {**rows[0], "payload": '{"text":"\u00e9t\u00e9 \u2603","n":[1,null]}'}
    rows[1] = {**rows[1], "payload": "null"}  # JSON null and NULL both read as None
    rows[2] = {**rows[2], "payload": None}
    schema = t.SCHEMAS[t.JOBS]
    # Chunks as Delta files give them: a value of a shared column may first appear in any one.
    chunks = [rows[:3], rows[3:4], [], rows[4 : len(rows) // 2], rows[len(rows) // 2 :]]
    table = pa.concat_tables([pa.Table.from_pylist(chunk, schema=schema) for chunk in chunks])
    assert table.column("status").num_chunks > 1
    records = records_from_arrow(table)
    assert records == [record_from_row(row) for row in rows]
    assert records[0].payload == {"text": "\u00e9t\u00e9 \u2603", "n": [1, None]}
    assert records[1].payload is None and records[2].payload is None
    reasons = {job.dead_reason for job in records}
    assert None in reasons and len(reasons) > 1 and None in {job.worker_id for job in records}
    # Columns of few values share one object per value, as the core interns them anyway.
    for name in ("exec", "client_id", "worker_id"):
        values = [getattr(job, name) for job in records]
        assert len({id(value) for value in values}) == len(set(values)), name


def test_the_columnar_reader_of_an_empty_table_and_of_one_value_per_column() -> None:
    import pyarrow as pa

    from dispatch.delta import tables as t
    from dispatch.delta.job_rows import record_from_row, records_from_arrow

    schema = t.SCHEMAS[t.JOBS]
    assert records_from_arrow(pa.Table.from_pylist([], schema=schema)) == []
    row = columnar_rows()[0]
    rows = [{**row, "id": f"j{n}", "seq": n} for n in range(3)]
    records = records_from_arrow(pa.Table.from_pylist(rows, schema=schema))
    assert records == [record_from_row(row) for row in rows]


@pytest.mark.parametrize(
    ("column", "value", "error"),
    [
        ("status", "sleeping", KeyError),
        ("status", None, KeyError),
        ("dead_reason", "bored", KeyError),
        ("payload", "1,2", ValueError),
        ("result", "{", ValueError),
    ],
)
def test_the_columnar_reader_refuses_what_no_record_has(
    column: str, value: str | None, error: type[Exception]
) -> None:
    import pyarrow as pa

    from dispatch.delta import tables as t
    from dispatch.delta.job_rows import records_from_arrow

    rows = columnar_rows()
    rows[3] = {**rows[3], column: value}
    with pytest.raises(error):
        records_from_arrow(pa.Table.from_pylist(rows, schema=t.SCHEMAS[t.JOBS]))

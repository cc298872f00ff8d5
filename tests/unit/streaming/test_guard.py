"""What the tables can hold: the checks the fold makes before building Arrow rows."""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest

from dispatch.core.events import Completed, Enqueued, LeaderElected
from dispatch.delta import tables as t
from dispatch.streaming import guard
from tests.unit.streaming.hostile import nested


def enqueued(**fields: object) -> Enqueued:
    values: dict[str, object] = {
        "epoch": 1, "at": 1_790_000_000.0, "job_id": "j", "client_id": "c", "exec": "a.b",
        "payload": {"n": 1}, "max_attempts": 3, "timeout_s": 30.0, "seq": 1,
    }  # fmt: skip
    values.update(fields)
    return Enqueued(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("event", "words"),
    [
        (enqueued(at=1e300), "not a time"),
        (enqueued(at=-5.0), "not a time"),
        (
            LeaderElected(epoch=2**63, at=1.0),
            "epoch: 9223372036854775808 does not fit events.epoch",
        ),
        (
            enqueued(max_attempts=2**31),
            "max_attempts: 2147483648 does not fit jobs.max_attempts (int32)",
        ),
        (enqueued(seq=-(2**63) - 1), "enqueued.seq"),
        (enqueued(job_id="\ud800"), "enqueued.job_id: '\\ud800' does not fit jobs.id (string)"),
        (enqueued(payload=math.nan), "NaN is not JSON"),
        (enqueued(payload={"a": [math.inf]}), "payload.a[0]: Infinity"),
        (enqueued(payload=2**64), "outside signed 64 bits"),
        (enqueued(payload=[[[0]]] * 2 + [nested(101)]), "deeper than 100"),
        (
            Completed(epoch=1, at=1.0, job_id="j", worker_id="\udc00", attempt=1, lease="l"),
            "worker_id",
        ),
    ],
)
def test_an_event_the_tables_cannot_hold_is_named(event: object, words: str) -> None:
    problem = guard.event_problem(event)  # type: ignore[arg-type]
    assert problem is not None and words in problem


def test_an_ordinary_event_passes() -> None:
    assert guard.event_problem(enqueued(payload=[[{"deep": list(range(3))}]] * 3)) is None
    assert guard.event_problem(enqueued(payload=nested(99))) is None


def test_values_at_the_edge_of_their_column_fit_and_fold_into_a_row_that_builds() -> None:
    from dispatch.core.reducer import fold_job_events
    from dispatch.delta.job_rows import JobState, job_row

    edge = enqueued(max_attempts=2**31 - 1, seq=-(2**63), client_id="é", at=guard.MAX_TIME_S)
    assert guard.event_problem(edge) is None
    folded = fold_job_events(None, [edge])
    assert folded is not None
    t.arrow_rows(t.JOBS, [job_row("g", JobState(folded))])


def test_rows_are_checked_against_the_table_schema() -> None:
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    row = {"date": when.date(), "topic": "t", "partition": 0, "offset": 1, "reason": "r",
           "rejected_time": when, "value": b"x"}  # fmt: skip
    assert guard.row_problem(t.REJECTED, row) is None
    pa.Table.from_pylist([row], schema=t.SCHEMAS[t.REJECTED])
    assert "rejected.source_partition" in (
        guard.row_problem(t.REJECTED, {**row, "source_partition": 2**40}) or ""
    )
    assert "rejected.reason" in (guard.row_problem(t.REJECTED, {**row, "reason": "\ud800"}) or "")
    assert "rejected.date" in (guard.row_problem(t.REJECTED, {**row, "date": when}) or "")


def test_kept_bytes_are_bounded_and_text_only_when_utf8() -> None:
    big = "é".encode() * guard.MAX_KEPT_BYTES
    assert guard.kept_bytes(big) == big[: guard.MAX_KEPT_BYTES]
    text = guard.kept_text(big)
    assert text is not None and set(text) == {"é"}
    assert guard.kept_text(b"\xff") is None and guard.kept_bytes(None) is None
    assert len(guard.bounded("x" * 10_000)) == guard.MAX_REASON_CHARS

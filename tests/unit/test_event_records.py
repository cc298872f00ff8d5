"""The events record format: an ordered batch per record, refused whole when malformed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.core.events import (
    Assigned,
    Cancelled,
    CancelRequested,
    Enqueued,
    Event,
    JobHeartbeat,
    LimitRemoved,
    LimitSet,
    Paused,
    PauseScope,
    Resumed,
    WorkerJoined,
)
from dispatch.core.limits import LimitScope
from dispatch.event_records import decode_batch, encode_batch, encode_batches
from tests.unit.streaming.hostile import hostile_record


def test_a_batch_round_trips_in_order() -> None:
    events = [
        WorkerJoined(epoch=3, at=10.0, worker_id="w1", subjects=("job.assign.>",)),
        Enqueued(
            epoch=3, at=10.5, job_id="j1", client_id="c", exec="a.b", payload={"k": [1, 2]},
            max_attempts=5, timeout_s=30.0, seq=1,
        ),
        Assigned(
            epoch=3, at=11.0, job_id="j1", worker_id="w1", attempt=1, lease="3-1", deadline=41.0
        ),
    ]  # fmt: skip
    batch = decode_batch(encode_batch("default", 3, events))
    assert (batch.group, batch.epoch) == ("default", 3)
    assert batch.events == events


def test_a_time_limit_and_a_running_job_s_cancel_round_trip() -> None:
    events: list[Event] = [
        Enqueued(
            epoch=3, at=10.5, job_id="j1", client_id="c", exec="a.b", payload=None,
            max_attempts=5, timeout_s=30.0, seq=1, max_run_s=60.0,
        ),
        CancelRequested(
            epoch=3, at=12.0, job_id="j1", worker_id="w1", attempt=1, deadline=42.0,
            by="ops-key", reason="not needed",
        ),
        Cancelled(epoch=3, at=13.0, job_id="j1", worker_id="w1", attempt=1, reason="stopped"),
        Cancelled(epoch=3, at=14.0, job_id="j2"),
    ]  # fmt: skip
    raw = encode_batch("default", 3, events)
    assert decode_batch(raw).events == events
    written = json.loads(raw)["events"]
    assert written[1]["by"] == "ops-key"
    # A queued job's cancel without a reason is written as before the new fields.
    assert written[3] == {"type": "cancelled", "epoch": 3, "at": 14.0, "job_id": "j2"}


def test_pauses_resumes_and_progress_reports_round_trip() -> None:
    events: list[Event] = [
        Paused(epoch=3, at=10.0, scope=PauseScope.EXEC, target="image.>", by="ops", reason="r"),
        Paused(epoch=3, at=10.5, scope=PauseScope.CLIENT, target="acme"),
        JobHeartbeat(
            epoch=3, at=11.0, job_id="j1", worker_id="w1", attempt=1, lease="3-1",
            deadline=41.0, progress={"done": 3.0, "total": 10.0, "message": "step é"},
        ),
        JobHeartbeat(
            epoch=3, at=11.5, job_id="j1", worker_id="w1", attempt=1, lease="3-1", deadline=41.5
        ),
        Resumed(epoch=3, at=12.0, scope=PauseScope.EXEC, target="image.>", by="ops"),
    ]  # fmt: skip
    raw = encode_batch("default", 3, events)
    assert decode_batch(raw).events == events
    written = json.loads(raw)["events"]
    assert written[1] == {
        "type": "paused", "epoch": 3, "at": 10.5, "scope": "client", "target": "acme",
    }  # fmt: skip
    # A heartbeat without a report is written as before the field.
    assert "progress" not in written[3]


def test_limits_and_a_job_s_key_round_trip() -> None:
    events: list[Event] = [
        LimitSet(
            epoch=3, at=10.0, scope=LimitScope.CLIENT, target="acme", max_inflight=10,
            rate=50.0, burst=100, by="ops", reason="noisy",
        ),
        LimitSet(epoch=3, at=10.5, scope=LimitScope.EXEC, target="image.>", max_inflight=4),
        LimitSet(epoch=3, at=10.6, scope=LimitScope.KEY, target="account:*", rate=2.5, burst=3),
        Enqueued(
            epoch=3, at=11.0, job_id="j1", client_id="acme", exec="image.resize", payload=None,
            max_attempts=5, timeout_s=30.0, seq=1, key="account:42",
        ),
        Enqueued(
            epoch=3, at=11.5, job_id="j2", client_id="acme", exec="image.resize", payload=None,
            max_attempts=5, timeout_s=30.0, seq=2,
        ),
        LimitRemoved(epoch=3, at=12.0, scope=LimitScope.CLIENT, target="acme", by="ops"),
    ]  # fmt: skip
    raw = encode_batch("default", 3, events)
    assert decode_batch(raw).events == events
    written = json.loads(raw)["events"]
    assert written[1] == {
        "type": "limit_set", "epoch": 3, "at": 10.5, "scope": "exec", "target": "image.>",
        "max_inflight": 4,
    }  # fmt: skip
    assert written[3]["key"] == "account:42"
    # A job without a key is written as before the field.
    assert "key" not in written[4]
    assert written[5] == {
        "type": "limit_removed", "epoch": 3, "at": 12.0, "scope": "client", "target": "acme",
        "by": "ops",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "part"),
    [
        (b"nope", "not JSON"),
        (json.dumps({"v": 99, "group": "g", "epoch": 1, "events": []}).encode(), "version"),
        (json.dumps({"v": 1, "group": "", "epoch": 1, "events": []}).encode(), "group"),
        (json.dumps({"v": 1, "group": "g", "epoch": -1, "events": []}).encode(), "epoch"),
        (
            json.dumps({"v": 1, "group": "g", "epoch": 1, "events": [{"type": "nope"}]}).encode(),
            r"events\[0\]",
        ),
        (
            json.dumps({"v": 1, "group": "g", "epoch": 1, "submit": [3], "events": []}).encode(),
            "submit",
        ),
        (
            json.dumps(
                {"v": 1, "group": "g", "epoch": 1, "submit": {"0": -1}, "events": []}
            ).encode(),
            r"submit\['0'\]",
        ),
        (
            json.dumps(
                {"v": 1, "group": "g", "epoch": 1, "submit": {"x": 1}, "events": []}
            ).encode(),
            r"submit\['x'\]",
        ),
    ],
)
def test_a_malformed_record_names_what_is_wrong(raw: bytes, part: str) -> None:
    with pytest.raises(ValueError, match=part):
        decode_batch(raw)


def enqueued(count: int) -> list[Event]:
    return [
        Enqueued(
            epoch=1, at=float(n), job_id=f"j{n}", client_id="c", exec="a.b", payload="x" * 500,
            max_attempts=5, timeout_s=30.0, seq=n,
        )
        for n in range(count)
    ]  # fmt: skip


def test_many_events_split_into_records_of_bounded_size_in_order() -> None:
    events = enqueued(100)
    records = encode_batches("g", 1, events, max_bytes=10_000)
    assert len(records) > 5
    assert all(len(record) <= 10_000 for record in records)
    decoded = [event for record in records for event in decode_batch(record).events]
    assert decoded == events


def test_an_event_larger_than_the_bound_still_gets_a_record_of_its_own() -> None:
    big = Enqueued(
        epoch=1, at=0.0, job_id="big", client_id="c", exec="a.b", payload="x" * 5000,
        max_attempts=1, timeout_s=1.0, seq=1,
    )  # fmt: skip
    records = encode_batches("g", 1, [big, big], max_bytes=1000)
    assert [decode_batch(record).events for record in records] == [[big], [big]]


def test_the_submit_position_rides_on_the_last_record_of_a_commit_only() -> None:
    events = enqueued(40)
    records = encode_batches("g", 1, events, max_bytes=10_000, submit={0: 41, 2: 7})
    batches = [decode_batch(record) for record in records]
    assert len(batches) > 1
    assert [batch.submit for batch in batches] == [None] * (len(batches) - 1) + [{0: 41, 2: 7}]
    assert decode_batch(encode_batch("g", 1, events)).submit is None


def test_a_commit_of_no_events_still_carries_its_position() -> None:
    (record,) = encode_batches("g", 2, [], submit={0: 5})
    batch = decode_batch(record)
    assert (batch.group, batch.epoch, batch.events, batch.submit) == ("g", 2, [], {0: 5})


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), hostile_record().filter(lambda v: v is not None)))
def test_any_bytes_decode_or_raise_value_error_only(raw: bytes) -> None:
    """Any producer can write the topic: whatever the bytes, the reader gets a batch or a
    ValueError naming the problem, never another exception."""
    try:
        decode_batch(raw)
    except ValueError as error:
        assert str(error).startswith("events record")


def test_json_nested_past_the_parser_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        decode_batch(b"[" * 100_000)
    with pytest.raises(ValueError, match="not JSON"):
        decode_batch(b"9" * 5_000)  # more digits than int() takes

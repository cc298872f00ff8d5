"""Kafka records of the three topics, decoded."""

from __future__ import annotations

import datetime as dt
import json
import math

from dispatch.core.events import Cancelled, LeaderElected
from dispatch.delta import tables as t
from dispatch.event_records import encode_batch
from dispatch.streaming import guard
from dispatch.streaming.decode import (
    KafkaRow,
    advance,
    decode_events,
    event_bronze_row,
    kafka_rows,
    merge_offsets,
    refusal_reason,
    refused_bronze_row,
    refused_record_row,
    rejected_row,
    screen_events,
    submit_bronze_row,
    undecodable_bronze_row,
    unseen,
)
from dispatch.submit_records import Rejection

WHEN = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def row(
    topic: str, partition: int, offset: int, value: bytes | None, key: bytes | None = None
) -> KafkaRow:
    return KafkaRow(topic, partition, offset, key, value, WHEN)


def test_rows_come_in_log_order_with_utc_times() -> None:
    naive = WHEN.replace(tzinfo=None)
    rows = kafka_rows(
        {
            "topic": ["b", "a", "a"],
            "partition": [0, 1, 0],
            "offset": [5, 1, 9],
            "key": [None, None, b"k"],
            "value": [b"1", b"2", b"3"],
            "timestamp": [naive, naive, naive],
        }
    )
    assert [(r.topic, r.partition, r.offset) for r in rows] == [
        ("a", 0, 9),
        ("a", 1, 1),
        ("b", 0, 5),
    ]
    assert all(r.timestamp == WHEN for r in rows)


def test_positions_filter_and_advance() -> None:
    rows = [row("t", 0, 3, b""), row("t", 0, 4, b""), row("t", 1, 0, b""), row("u", 0, 7, b"")]
    assert [r.offset for r in unseen(rows, {"t": {0: 4}})] == [4, 0, 7]
    assert advance({"t": {0: 9}}, rows) == {"t": {0: 9, 1: 1}, "u": {0: 8}}
    assert merge_offsets({"t": {0: 3}}, {"t": {0: 2, 1: 5}}, {}) == {"t": {0: 3, 1: 5}}


def test_events_records_explode_and_bad_ones_are_kept_aside() -> None:
    events = [
        LeaderElected(epoch=2, at=10.0, holder="n"),
        Cancelled(epoch=2, at=11.0, job_id="j"),
    ]
    good = row("ev", 0, 7, encode_batch("g", 2, events))
    bad = row("ev", 0, 8, b"{}")
    logged, undecodable = decode_events([good, bad, row("ev", 0, 9, None)])
    assert [(e.offset, e.index, e.group, e.event) for e in logged] == [
        (7, 0, "g", events[0]),
        (7, 1, "g", events[1]),
    ]
    assert [u.row.offset for u in undecodable] == [8, 9]
    bronze = event_bronze_row(logged[1], good, admitted=False, batch_id=3)
    assert bronze["kind"] == "event" and bronze["job_id"] == "j" and bronze["admitted"] is False
    assert json.loads(bronze["body"]) == events[1].to_dict()
    assert bronze["event_time"] == dt.datetime.fromtimestamp(11.0, dt.UTC)
    assert bronze["date"] == dt.date(1970, 1, 1) and bronze["raw"] is None
    broken = undecodable_bronze_row(undecodable[0], batch_id=3)
    assert broken["kind"] == "undecodable" and broken["raw"] == b"{}" and broken["error"]
    assert broken["date"] == WHEN.date()


def test_submit_and_rejection_records() -> None:
    submitted = submit_bronze_row(row("s", 1, 2, b'{"id":"x"}', key=b"x"), batch_id=0)
    assert submitted["job_id"] == "x" and submitted["raw"] == b'{"id":"x"}'
    rejection = Rejection("bad exec", "s", 1, 2, b"x", b'{"id":"x","exec":1}', 50.0)
    kept = rejected_row(row("r", 0, 4, rejection.to_record_value()), batch_id=1)
    assert kept["reason"] == "bad exec" and kept["job_id"] == "x"
    assert (kept["source_topic"], kept["source_partition"], kept["source_offset"]) == ("s", 1, 2)
    assert kept["value"] == b'{"id":"x","exec":1}' and kept["at"] == 50.0
    nonsense = rejected_row(row("r", 0, 5, b"\xff"), batch_id=1)
    assert nonsense["reason"].startswith("undecodable rejection record")
    assert nonsense["value"] == b"\xff" and nonsense["value_text"] is None


def test_events_the_tables_cannot_hold_are_screened_out_with_their_reason() -> None:
    good = Cancelled(epoch=2, at=11.0, job_id="j")
    bad = Cancelled(epoch=2, at=1e300, job_id="k")
    logged, _ = decode_events([row("ev", 0, 7, encode_batch("g", 2, [good, bad]))])
    kept, refused = screen_events(logged)
    assert [e.event for e in kept] == [good]
    [why] = refused
    assert why.logged.index == 1 and "cancelled.at" in why.reason
    bronze = refused_bronze_row(why, row("ev", 0, 7, b""), batch_id=1)
    assert (bronze["kind"], bronze["idx"], bronze["type"]) == ("refused", 1, "cancelled")
    assert refusal_reason(why).startswith("events[1] (cancelled of job 'k'): cancelled.at")


def test_a_record_header_the_tables_cannot_hold_is_undecodable() -> None:
    raw = json.dumps({"v": 1, "group": "\ud800", "epoch": 1, "events": []}).encode()
    huge = json.dumps({"v": 1, "group": "g", "epoch": 2**63, "events": []}).encode()
    deep = b"[" * 60_000
    _, bad = decode_events([row("ev", 0, 1, raw), row("ev", 0, 2, huge), row("ev", 0, 3, deep)])
    assert [b.reason.split(":")[0] for b in bad] == [
        "events record.group", "events record.epoch", "events record",
    ]  # fmt: skip


def test_a_rejection_record_with_values_no_column_holds_is_kept_as_undecodable() -> None:
    rejection = Rejection("r", "dispatch.submit", 0, 1, b"k", b"v", 1.0)
    document = json.loads(rejection.to_record_value())
    for change in ({"partition": 2**40}, {"at": 1e300}, {"at": math.nan}, {"reason": "\ud800"}):
        value = json.dumps({**document, **change}).encode()
        kept = rejected_row(row("r", 0, 4, value), batch_id=1)
        assert kept["reason"].startswith("undecodable rejection record"), change
        assert kept["value"] == value
    nested = rejected_row(row("r", 0, 5, b"[" * 60_000), batch_id=1)
    assert nested["reason"].startswith("undecodable rejection record")


def test_kafka_times_as_microseconds_are_clamped_into_what_the_tables_hold() -> None:
    """A producer sets its record's time: one past year 9999 (or none) must not stop the
    batch while it is collected."""
    rows = kafka_rows(
        {
            "topic": ["t"] * 4, "partition": [0] * 4, "offset": [0, 1, 2, 3],
            "key": [None] * 4, "value": [b""] * 4,
            "timestamp": [int(WHEN.timestamp() * 1e6), 2**62, -1, None],
        }
    )  # fmt: skip
    assert rows[0].timestamp == WHEN
    assert rows[1].timestamp.year == 9999 and rows[2].timestamp.year == 1970
    assert rows[3].timestamp == dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def test_a_refused_records_row_drops_a_job_id_its_column_cannot_hold() -> None:
    # The job id can be the very value refused: a lone surrogate (JSON's "\ud800") made the
    # `rejected` write raise UnicodeEncodeError, on every replay of the batch.
    poison = row("dispatch.events", 0, 7, b'{"v": 1}', key=b"default")
    rejected = refused_record_row(poison, ["events[0]: a lone surrogate"], "\ud800", batch_id=3)
    assert rejected["job_id"] is None
    assert guard.row_problem(t.REJECTED, rejected) is None
    kept = refused_record_row(poison, ["events[0]: too big"], "job-1", batch_id=3)
    assert kept["job_id"] == "job-1"

"""Kafka records of the three topics, decoded."""

from __future__ import annotations

import datetime as dt
import json

from dispatch.core.events import Cancelled, LeaderElected
from dispatch.event_records import encode_batch
from dispatch.submit_records import Rejection
from streaming.decode import (
    KafkaRow,
    advance,
    decode_events,
    event_bronze_row,
    kafka_rows,
    merge_offsets,
    rejected_row,
    submit_bronze_row,
    undecodable_bronze_row,
    unseen,
)

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

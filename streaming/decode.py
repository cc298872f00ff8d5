"""Kafka records of the three topics, decoded into what the fold and the tables need.

Pure Python (no Spark): the micro-batch arrives as columns, `kafka_rows` turns it into
`KafkaRow`s in log order, and `decode_events` / `rejected_row` / `submit_row` parse each
record with the project's own formats (`dispatch.event_records`, `dispatch.submit_records`).
A record that does not parse is never dropped: it becomes an `undecodable` row in `events`
(bronze) with the reason, and the fold skips it (the leader could not replay it either).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatch.core.events import Event, JobEvent
from dispatch.event_records import decode_batch
from dispatch.submit_records import Rejection

UTC = dt.UTC


@dataclass(frozen=True, slots=True)
class Topics:
    """The names of the three topics the application reads."""

    submit: str
    events: str
    rejected: str

    def all(self) -> tuple[str, str, str]:
        return (self.submit, self.events, self.rejected)


@dataclass(frozen=True, slots=True)
class KafkaRow:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: dt.datetime
    """The record's Kafka timestamp (producer create time), UTC."""


Offsets = dict[str, dict[int, int]]
"""topic -> partition -> next offset to read (the Kafka convention for a position)."""


def kafka_rows(columns: Mapping[str, Sequence[Any]]) -> list[KafkaRow]:
    """Rows from the Kafka source's columns (topic, partition, offset, key, value, timestamp),
    sorted in log order: by topic, partition, offset."""
    rows = [
        KafkaRow(topic, int(partition), int(offset), key, value, _utc(timestamp))
        for topic, partition, offset, key, value, timestamp in zip(
            columns["topic"],
            columns["partition"],
            columns["offset"],
            columns["key"],
            columns["value"],
            columns["timestamp"],
            strict=True,
        )
    ]
    rows.sort(key=lambda row: (row.topic, row.partition, row.offset))
    return rows


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def unseen(rows: Iterable[KafkaRow], watermark: Offsets) -> list[KafkaRow]:
    """The rows at or after `watermark` (what a table has not absorbed yet)."""
    return [row for row in rows if row.offset >= watermark.get(row.topic, {}).get(row.partition, 0)]


def advance(offsets: Offsets, rows: Iterable[KafkaRow]) -> Offsets:
    """`offsets` moved past `rows` (never backwards)."""
    out = {topic: dict(partitions) for topic, partitions in offsets.items()}
    for row in rows:
        partitions = out.setdefault(row.topic, {})
        if row.offset + 1 > partitions.get(row.partition, 0):
            partitions[row.partition] = row.offset + 1
    return out


def merge_offsets(*positions: Offsets) -> Offsets:
    """Per topic and partition, the furthest position of all."""
    out: Offsets = {}
    for offsets in positions:
        for topic, partitions in offsets.items():
            merged = out.setdefault(topic, {})
            for partition, offset in partitions.items():
                merged[partition] = max(offset, merged.get(partition, offset))
    return out


# --- dispatch.events -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One event of the log, with its place: (partition, offset, index in the record)."""

    partition: int
    offset: int
    index: int
    group: str
    record_epoch: int
    event: Event


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A record that does not parse, and why."""

    row: KafkaRow
    reason: str


def decode_events(rows: Iterable[KafkaRow]) -> tuple[list[LoggedEvent], list[Undecodable]]:
    """Explode events records into their events, in log order; collect the bad records."""
    events: list[LoggedEvent] = []
    bad: list[Undecodable] = []
    for row in rows:
        if row.value is None:
            bad.append(Undecodable(row, "events record: no value (tombstone)"))
            continue
        try:
            batch = decode_batch(row.value)
        except ValueError as error:
            bad.append(Undecodable(row, str(error)))
            continue
        for index, event in enumerate(batch.events):
            events.append(
                LoggedEvent(row.partition, row.offset, index, batch.group, batch.epoch, event)
            )
    return events, bad


# --- bronze rows -----------------------------------------------------------------------------


def _timestamp(at: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(at, UTC)


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _bronze(row: KafkaRow, kind: str, batch_id: int, **fields: Any) -> dict[str, Any]:
    event_time: dt.datetime = fields.pop("event_time", None) or row.timestamp
    base: dict[str, Any] = {
        "date": event_time.date(),
        "topic": row.topic,
        "partition": row.partition,
        "offset": row.offset,
        "idx": 0,
        "kind": kind,
        "dispatch_group": None,
        "record_epoch": None,
        "type": None,
        "epoch": None,
        "at": None,
        "event_time": event_time,
        "job_id": None,
        "worker_id": None,
        "admitted": None,
        "body": None,
        "raw": None,
        "error": None,
        "kafka_time": row.timestamp,
        "batch_id": batch_id,
    }
    base.update(fields)
    return base


def event_bronze_row(
    logged: LoggedEvent, row: KafkaRow, admitted: bool, batch_id: int
) -> dict[str, Any]:
    """The `events` row of one logged event. `body` is the event's own JSON."""
    event = logged.event
    document = event.to_dict()
    return _bronze(
        row,
        "event",
        batch_id,
        event_time=_timestamp(event.at),
        idx=logged.index,
        dispatch_group=logged.group,
        record_epoch=logged.record_epoch,
        type=event.type,
        epoch=event.epoch,
        at=event.at,
        job_id=event.job_id if isinstance(event, JobEvent) else None,
        worker_id=document.get("worker_id"),
        admitted=admitted,
        body=json.dumps(document, separators=(",", ":")),
    )


def undecodable_bronze_row(bad: Undecodable, batch_id: int) -> dict[str, Any]:
    return _bronze(
        bad.row,
        "undecodable",
        batch_id,
        body=_text(bad.row.value),
        raw=bad.row.value,
        error=bad.reason,
    )


def submit_bronze_row(row: KafkaRow, batch_id: int) -> dict[str, Any]:
    """A submission as produced (validated later by the leader: see `rejected`)."""
    return _bronze(
        row,
        "submit",
        batch_id,
        job_id=_text(row.key),
        body=_text(row.value),
        raw=row.value,
    )


def rejected_bronze_row(row: KafkaRow, batch_id: int) -> dict[str, Any]:
    return _bronze(row, "rejected", batch_id, body=_text(row.value), raw=row.value)


# --- dispatch.submit.rejected ----------------------------------------------------------------


def rejected_row(row: KafkaRow, batch_id: int) -> dict[str, Any]:
    """The `rejected` table row of one rejection record (a bad one is kept with its reason)."""
    out: dict[str, Any] = {
        "topic": row.topic,
        "partition": row.partition,
        "offset": row.offset,
        "kafka_time": row.timestamp,
        "batch_id": batch_id,
    }
    try:
        if row.value is None:
            raise ValueError("no value (tombstone)")
        rejection = Rejection.from_record_value(row.value)
    except (ValueError, KeyError, TypeError) as error:
        out.update(
            date=row.timestamp.date(),
            reason=f"undecodable rejection record: {error!r}",
            source_topic=None,
            source_partition=None,
            source_offset=None,
            key=row.key,
            value=row.value,
            value_text=_text(row.value),
            job_id=None,
            at=row.timestamp.timestamp(),
            rejected_time=row.timestamp,
        )
        return out
    rejected_time = _timestamp(rejection.at)
    out.update(
        date=rejected_time.date(),
        reason=rejection.reason,
        source_topic=rejection.topic,
        source_partition=rejection.partition,
        source_offset=rejection.offset,
        key=rejection.key,
        value=rejection.value,
        value_text=_text(rejection.value),
        job_id=_job_id_of(rejection.key, rejection.value),
        at=rejection.at,
        rejected_time=rejected_time,
    )
    return out


def _job_id_of(key: bytes | None, value: bytes | None) -> str | None:
    """Best effort: the id the producer meant (from the value, else the key)."""
    text = _text(value)
    if text is not None:
        try:
            document = json.loads(text)
        except json.JSONDecodeError:
            document = None
        if isinstance(document, dict) and isinstance(document.get("id"), str):
            return str(document["id"])
    return _text(key)

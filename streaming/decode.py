"""Kafka records of the three topics, decoded into what the fold and the tables need.

Pure Python (no Spark): the micro-batch arrives as columns, `kafka_rows` turns it into
`KafkaRow`s in log order, and `decode_events` / `rejected_row` / `submit_row` parse each
record with the project's own formats (`dispatch.event_records`, `dispatch.submit_records`).
A record that does not parse is never dropped: it becomes an `undecodable` row in `events`
(bronze) with the reason and a `rejected` row, and the fold skips it. `screen_events` then sets
aside the events whose values no table can hold (`dispatch.streaming.guard`): each becomes a
`refused` row in `events` and is named in its record's `rejected` row. Nothing a record holds makes
these functions raise: a record is untrusted input, and one that stopped the batch would stop it
again on every replay.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatch.core.events import Event, JobEvent
from dispatch.delta import tables as t
from dispatch.delta.progress import Offsets
from dispatch.event_records import decode_batch
from dispatch.streaming import guard
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


def kafka_rows(columns: Mapping[str, Sequence[Any]]) -> list[KafkaRow]:
    """Rows from the Kafka source's columns (topic, partition, offset, key, value, timestamp),
    sorted in log order: by topic, partition, offset. `timestamp`: datetimes, or unix
    microseconds (what the writer collects: a producer sets a record's time, and one past
    year 9999 would not even become a Python datetime)."""
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


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_MAX_MICROS = int(guard.MAX_TIME_S * 1_000_000)


def _utc(value: dt.datetime | int | None) -> dt.datetime:
    if value is None or isinstance(value, int):
        # A record's Kafka time is its producer's claim: clamped into what the tables hold
        # (it only dates bronze rows; a record's own events carry their times).
        micros = min(max(value or 0, 0), _MAX_MICROS)
        return _EPOCH + dt.timedelta(microseconds=micros)
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


RECORD_ERRORS = (ValueError, TypeError, KeyError, RecursionError, OverflowError)
"""What parsing a hostile record may raise (RecursionError: JSON nested too deeply for the
parser; OverflowError: a number too large for a float)."""


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
        except RECORD_ERRORS as error:
            bad.append(Undecodable(row, guard.bounded(_reason(error))))
            continue
        problem = guard.header_problem(batch.group, batch.epoch)
        if problem is not None:
            bad.append(Undecodable(row, problem))
            continue
        for index, event in enumerate(batch.events):
            events.append(
                LoggedEvent(row.partition, row.offset, index, batch.group, batch.epoch, event)
            )
    return events, bad


def _reason(error: BaseException) -> str:
    if isinstance(error, RecursionError):
        return "events record: nested too deeply to parse"
    if isinstance(error, ValueError):
        return str(error)
    return f"events record: {type(error).__name__}: {error}"


@dataclass(frozen=True, slots=True)
class Refused:
    """An event the fold does not apply, and why: its values do not fit the tables
    (`screen_events`), or it does not fit its job (`dispatch.streaming.fold.fold_batch`)."""

    logged: LoggedEvent
    reason: str


def screen_events(events: Iterable[LoggedEvent]) -> tuple[list[LoggedEvent], list[Refused]]:
    """The events whose own values the tables can hold, and the others with the reason. The
    refused ones are neither fenced nor folded (what is not written cannot be replayed)."""
    kept: list[LoggedEvent] = []
    refused: list[Refused] = []
    for logged in events:
        problem = guard.event_problem(logged.event)
        if problem is None:
            kept.append(logged)
        else:
            refused.append(Refused(logged, guard.bounded(problem)))
    return kept, refused


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
        body=guard.kept_text(bad.row.value),
        raw=guard.kept_bytes(bad.row.value),
        error=bad.reason,
    )


def refused_bronze_row(refused: Refused, row: KafkaRow, batch_id: int) -> dict[str, Any]:
    """The `events` row of an event `screen_events` set aside: its place, type and reason, and
    its JSON (ASCII, so always writable; cut at MAX_KEPT_BYTES); nothing else of it is
    trusted to fit a column."""
    logged = refused.logged
    try:
        body: str | None = json.dumps(logged.event.to_dict(), separators=(",", ":"))
    except (ValueError, RecursionError, OverflowError):
        body = None
    return _bronze(
        row,
        "refused",
        batch_id,
        idx=logged.index,
        dispatch_group=logged.group,
        record_epoch=logged.record_epoch,
        type=logged.event.type,
        body=None if body is None else guard.bounded(body, guard.MAX_KEPT_BYTES),
        error=refused.reason,
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
        problem = guard.row_problem(t.REJECTED, out)
        if problem is not None:
            raise ValueError(problem)
    except (*RECORD_ERRORS, OSError) as error:  # OSError: a time the platform cannot convert
        out.update(
            date=row.timestamp.date(),
            reason=guard.bounded(f"undecodable rejection record: {error!r}"),
            source_topic=None,
            source_partition=None,
            source_offset=None,
            key=row.key,
            value=guard.kept_bytes(row.value),
            value_text=guard.kept_text(row.value),
            job_id=None,
            at=row.timestamp.timestamp(),
            rejected_time=row.timestamp,
        )
    return out


def refused_record_row(
    row: KafkaRow, reasons: Sequence[str], job_id: str | None, batch_id: int
) -> dict[str, Any]:
    """The `rejected` row of an events record the fold could not take whole: undecodable
    (one reason), or with events refused (one reason each, `events[i] (...): why`). The
    source is the record itself; times are its Kafka time, so a replay writes the same row."""
    return {
        "date": row.timestamp.date(),
        "topic": row.topic,
        "partition": row.partition,
        "offset": row.offset,
        "reason": guard.bounded("; ".join(reasons)),
        "source_topic": row.topic,
        "source_partition": row.partition,
        "source_offset": row.offset,
        "key": guard.kept_bytes(row.key),
        "value": guard.kept_bytes(row.value),
        "value_text": guard.kept_text(row.value),
        # A job id is screened for its own column only where an event is applied; here it
        # may be the very value refused (a lone surrogate pyarrow cannot encode).
        "job_id": job_id if job_id is not None and guard.utf8(job_id) else None,
        "at": row.timestamp.timestamp(),
        "rejected_time": row.timestamp,
        "kafka_time": row.timestamp,
        "batch_id": batch_id,
    }


def refusal_reason(refused: Refused) -> str:
    """`events[i] (type of job 'id'): why`, for the record's `rejected` row."""
    event = refused.logged.event
    about = f" of job {event.job_id!r}" if isinstance(event, JobEvent) else ""
    return f"events[{refused.logged.index}] ({event.type}{about}): {refused.reason}"


def _job_id_of(key: bytes | None, value: bytes | None) -> str | None:
    """Best effort: the id the producer meant (from the value, else the key)."""
    text = _text(value)
    if text is not None:
        try:
            document = json.loads(text)
        except (ValueError, RecursionError):
            document = None
        if isinstance(document, dict):
            job_id = document.get("id")
            if isinstance(job_id, str) and guard.utf8(job_id):
                return guard.bounded(job_id, 1024)
    key_text = _text(key)
    return None if key_text is None else guard.bounded(key_text, 1024)

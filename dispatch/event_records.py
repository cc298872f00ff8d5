"""The `dispatch.events` record format: one record carries an ordered batch of events.

kafka-python is pure Python, so a record per event per job costs more than the dispatching
itself; the leader writes everything one transaction decided as one record (docs/spec.md,
*Amortise per-record cost*), and the streaming fold explodes it. Key: the dispatcher group,
so a group's batches stay in one partition, in order.

Value: `{"v": 1, "group": str, "epoch": int, "submit": {partition: offset}, "events": [...]}`
(`events`: `event.to_dict()` of each, in order).

`submit` (optional, on the last record of a leader's commit) is the leader's position in
`dispatch.submit` once that commit is durable: for every partition, the offset of the next
submission to read. It commits in the same transaction as the events, so a new leader resumes
reading submissions exactly where the log's state ends (`dispatch.api.kafka_log`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dispatch import fast_json
from dispatch.core.events import Event, event_from_dict

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class EventBatch:
    group: str
    epoch: int
    events: list[Event]
    submit: dict[int, int] | None = None
    """The leader's submit position after this batch (partition -> next offset), if carried."""


MAX_RECORD_BYTES = 4 * 1024 * 1024
"""Aim for records of at most this size; the events topic accepts 16 MiB (one event carries a
payload of up to `api.max_payload_bytes`, so a single event may exceed the aim)."""


def encode_batch(group: str, epoch: int, events: Sequence[Event]) -> bytes:
    """One record holding all `events` (use `encode_batches` when they may be many)."""
    return b"".join(_records(group, epoch, [_encode(event) for event in events], None))


def encode_batches(
    group: str,
    epoch: int,
    events: Sequence[Event],
    max_bytes: int = MAX_RECORD_BYTES,
    *,
    submit: Mapping[int, int] | None = None,
) -> list[bytes]:
    """The events, in order, as as few records as fit `max_bytes` each (at least one event
    per record; one empty record when there are none). They go into one transaction, so they
    become visible together; the last one carries the `submit` position, if given."""
    return _records(group, epoch, [_encode(event) for event in events], max_bytes, submit)


def _encode(event: Event) -> bytes:
    return fast_json.dumps(event.to_dict())


def _records(
    group: str,
    epoch: int,
    encoded: list[bytes],
    max_bytes: int | None,
    submit: Mapping[int, int] | None = None,
) -> list[bytes]:
    head = _head(group, epoch, None)
    records: list[bytes] = []
    chunk: list[bytes] = []
    size = len(head) + 2
    for item in encoded:
        if chunk and max_bytes is not None and size + len(item) + 1 > max_bytes:
            records.append(head + b",".join(chunk) + b"]}")
            chunk, size = [], len(head) + 2
        chunk.append(item)
        size += len(item) + 1
    # The size aim ignores the position's few bytes.
    records.append(_head(group, epoch, submit) + b",".join(chunk) + b"]}")
    return records


def _head(group: str, epoch: int, submit: Mapping[int, int] | None) -> bytes:
    position = b""
    if submit is not None:
        position = b'"submit":%s,' % json.dumps({str(p): o for p, o in submit.items()}).encode()
    return b'{"v":%d,"group":%s,"epoch":%d,%s"events":[' % (
        FORMAT_VERSION, json.dumps(group).encode(), epoch, position,
    )  # fmt: skip


def decode_batch(raw: bytes) -> EventBatch:
    """Parse one events record; ValueError naming the bad part if it is not one (whatever the
    bytes: nothing else escapes)."""
    try:
        document = json.loads(raw)
    except RecursionError:
        # Any producer can write this topic: a deep value must be a refused record, like
        # every other malformed one, not an error its reader does not expect.
        raise ValueError("events record: nested too deeply to parse") from None
    except ValueError as error:  # not UTF-8, not JSON, or an integer of too many digits
        raise ValueError(f"events record: not JSON ({error})") from None
    if not isinstance(document, dict):
        raise ValueError("events record: expected a JSON object")
    if document.get("v") != FORMAT_VERSION:
        raise ValueError(f"events record.v: unsupported format version {document.get('v')!r}")
    group, epoch, events = document.get("group"), document.get("epoch"), document.get("events")
    if not isinstance(group, str) or not group:
        raise ValueError("events record.group: expected a non-empty string")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError("events record.epoch: expected an integer >= 0")
    if not isinstance(events, list):
        raise ValueError("events record.events: expected a list")
    submit = _submit_position(document.get("submit"))
    parsed = []
    for index, item in enumerate(events):
        try:
            parsed.append(event_from_dict(item))
        except ValueError as error:
            raise ValueError(f"events record.events[{index}]: {error}") from None
    return EventBatch(group, epoch, parsed, submit)


def _submit_position(value: object) -> dict[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("events record.submit: expected an object of partition -> offset")
    position = {}
    for partition, offset in value.items():
        valid = isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0
        # isascii: str.isdigit() also takes digits int() refuses ("²") or reads (Arabic-Indic).
        if not (partition.isascii() and partition.isdigit() and valid):
            raise ValueError(f"events record.submit[{partition!r}]: expected an offset >= 0")
        position[int(partition)] = offset
    return position

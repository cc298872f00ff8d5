"""`MemoryLog`: the in-memory twin of the dispatcher's topics, behind
`dispatch.api.leader_io.NodeIO`.

For tests of the leader's and the API's logic that need no broker (as dramatiq's
`brokers/stub.py`): a node built with `Node(..., io=MemoryLog(settings))` runs in the test's
process, elects itself through the real lease table on disk, and commits to lists.

What it keeps of Kafka's contract, because the leader relies on it:
- a commit is atomic: its events records, rejections and group offsets land together, or,
  when the log is `down` or the writer was fenced, none of them (and the commit raises);
- opening a group's log fences every writer the group opened before (`init_transactions`);
- readers see committed records only, in offset order, from any position; a position below
  the log's start (`trim_events`) raises `SnapshotBehindLog`, as retention does;
- submissions are spread over `kafka.submit_partitions` partitions by key.
What it does not model (real-broker tests keep these): a kill -9 mid-transaction, network
timeouts, replication, the group coordinator, record size limits.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dispatch.api.kafka_log import SnapshotBehindLog, SubmitRecord, submit_group_id
from dispatch.api.submit_producer import SubmitUnavailable
from dispatch.core.commands import SubmitRequest
from dispatch.event_records import EventBatch, decode_batch
from dispatch.settings import Settings
from dispatch.submit_records import submit_record_value

if TYPE_CHECKING:
    from dispatch.delta.snapshot import Snapshot

log = logging.getLogger(__name__)


class LogUnavailable(Exception):
    """The in-memory log is `down` (what a dead broker is to Kafka's clients)."""


class WriterFenced(Exception):
    """A newer writer of the same group opened the log: this one may commit nothing more."""


@dataclass
class MemoryLog:
    """The submit, events and rejected topics of one dispatcher group's log, in memory.

    Thread-safe: a node's request threads, its leader loop and the test share it."""

    settings: Settings
    submit: list[list[SubmitRecord]] = field(init=False)
    """Per partition, every submission written (the test may append hostile ones)."""
    events: list[bytes] = field(default_factory=list)
    """Committed events records; offset = `events_start` + index."""
    events_start: int = 0
    rejected: list[bytes] = field(default_factory=list)
    group_offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    snapshot: Snapshot | None = None
    """What `latest_snapshot` answers (None: no snapshot yet)."""
    down: bool = False
    """While True every write and read fails, as with a dead broker."""
    commits: int = 0
    _writers: dict[str, int] = field(default_factory=dict)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.submit = [[] for _ in range(self.settings.kafka.submit_partitions)]

    # --- what tests do --------------------------------------------------------------------

    def append_submission(self, key: bytes | None, value: bytes | None) -> SubmitRecord:
        """Write a raw record to the submit topic (any producer may write anything)."""
        with self._changed:
            self._check_up()
            partition = zlib.crc32(key or b"") % len(self.submit)
            record = SubmitRecord(partition, len(self.submit[partition]), key, value)
            self.submit[partition].append(record)
            self._changed.notify_all()
            return record

    def trim_events(self, new_start: int) -> None:
        """Retention: the events log no longer holds the records before `new_start`."""
        with self._changed:
            drop = max(0, new_start - self.events_start)
            del self.events[:drop]
            self.events_start += drop

    def batches(self) -> list[EventBatch]:
        """Every committed events batch still held, decoded."""
        with self._changed:
            return [decode_batch(raw) for raw in self.events]

    def submitted_keys(self) -> list[bytes]:
        with self._changed:
            return [r.key for partition in self.submit for r in partition if r.key is not None]

    # --- NodeIO -----------------------------------------------------------------------------

    def open_log(self, group: str, client_id: str) -> MemoryTransactionalLog:
        with self._changed:
            self._check_up()
            generation = self._writers.get(group, 0) + 1
            self._writers[group] = generation
        return MemoryTransactionalLog(self, group, generation)

    def open_submit_source(
        self, group: str, client_id: str, position: Mapping[int, int] | None
    ) -> MemorySubmitSource:
        with self._changed:
            committed = dict(self.group_offsets.get(submit_group_id(group), {}))
        start = {
            partition: max((position or {}).get(partition, 0), committed.get(partition, 0))
            for partition in range(len(self.submit))
        }
        return MemorySubmitSource(self, start)

    def open_log_reader(self, client_id: str) -> MemoryLogReader:
        return MemoryLogReader(self)

    def latest_snapshot(self, group: str) -> Snapshot | None:
        return self.snapshot if self.snapshot is not None and self.snapshot.group == group else None

    def open_submit_sink(self, client_id: str) -> MemorySubmitSink:
        return MemorySubmitSink(self)

    def open_lag_source(self, client_id: str) -> None:
        """No streaming fold reads an in-memory log."""
        return None

    # --- for its parts ----------------------------------------------------------------------

    def _check_up(self) -> None:
        if self.down:
            raise LogUnavailable("the log is down")

    def _commit(
        self,
        writer: MemoryTransactionalLog,
        events_records: Sequence[bytes],
        rejections: Sequence[bytes],
        group_offsets: Mapping[int, int] | None,
    ) -> None:
        with self._changed:
            self._check_up()
            if self._writers.get(writer.group) != writer.generation:
                raise WriterFenced(f"a newer writer of group {writer.group!r} opened the log")
            self.events.extend(events_records)
            self.rejected.extend(rejections)
            if group_offsets:
                self.group_offsets[submit_group_id(writer.group)] = dict(group_offsets)
            self.commits += 1
            self._changed.notify_all()


@dataclass
class MemoryTransactionalLog:
    memory: MemoryLog
    group: str
    generation: int

    def commit(
        self,
        events_records: Sequence[bytes],
        rejections: Sequence[bytes],
        group_offsets: Mapping[int, int] | None = None,
    ) -> None:
        self.memory._commit(self, events_records, rejections, group_offsets)

    def close(self) -> None:
        """Nothing is held open between commits."""


class MemorySubmitSource:
    def __init__(self, memory: MemoryLog, start: dict[int, int]) -> None:
        self.memory = memory
        self.topic = memory.settings.kafka.submit_topic
        self.position = start
        self._moved = False
        self._woken = False

    def poll(self, timeout_ms: int) -> list[SubmitRecord]:
        memory = self.memory
        deadline = time.monotonic() + timeout_ms / 1000
        with memory._changed:
            while True:
                records = [] if memory.down else self._unread()
                remaining = deadline - time.monotonic()
                if records or remaining <= 0 or self._woken:
                    break
                memory._changed.wait(remaining)
            self._woken = False
        for record in records:
            self.position[record.partition] = record.offset + 1
        self._moved = self._moved or bool(records)
        return records

    def _unread(self) -> list[SubmitRecord]:
        return [
            record
            for partition, held in enumerate(self.memory.submit)
            for record in held[self.position.get(partition, 0) :]
        ]

    def wake(self) -> None:
        with self.memory._changed:
            self._woken = True
            self.memory._changed.notify_all()

    def broker_answers(self) -> bool:
        return not self.memory.down

    def take_moved(self) -> bool:
        moved, self._moved = self._moved, False
        return moved

    def close(self) -> None:
        """Nothing to release."""


class MemoryLogReader:
    def __init__(self, memory: MemoryLog) -> None:
        self.memory = memory
        self.topic = memory.settings.kafka.events_topic

    def replay(
        self, start: Mapping[int, int] | None = None, *, complete: bool = False
    ) -> Iterator[EventBatch]:
        memory = self.memory
        with memory._changed:
            memory._check_up()
            offset = (start or {}).get(0)
            if offset is None:
                offset = 0 if complete else memory.events_start
            if offset < memory.events_start:
                raise SnapshotBehindLog(self.topic, 0, offset, memory.events_start)
            held = memory.events[offset - memory.events_start :]
        for at, raw in enumerate(held, start=offset):
            try:
                yield decode_batch(raw)
            except ValueError as error:
                # As `dispatch.api.kafka_log.EventsReader`: a record no leader wrote is named,
                # skipped.
                log.error("replaying %s: skipped the record at 0/%d: %s", self.topic, at, error)

    def last_submit_position(
        self, group: str, *, before: Mapping[int, int]
    ) -> dict[int, int] | None:
        """The position `group`'s last events record before `before` carried (records that
        carry none, as a legacy log's, are passed over)."""
        memory = self.memory
        end = before.get(0)
        if end is None:
            return None
        with memory._changed:
            held = memory.events[: max(0, end - memory.events_start)]
        for raw in reversed(held):
            batch = decode_batch(raw)
            if batch.group == group and batch.submit is not None:
                return batch.submit
        return None

    def close(self) -> None:
        """Nothing to release."""


class MemorySubmitSink:
    def __init__(self, memory: MemoryLog) -> None:
        self.memory = memory

    async def send(self, submissions: Sequence[SubmitRequest]) -> None:
        try:
            for submission in submissions:
                self.memory.append_submission(
                    submission.id.encode(), submit_record_value(submission)
                )
        except LogUnavailable as down:
            raise SubmitUnavailable(f"the log did not take it: {down}") from down

    def close(self, timeout_s: float) -> None:
        """Every send is durable when it returns: nothing to flush."""

"""The leader's Kafka adapter: the submit reader, the transactional event log, and replay.

Write-ahead, for real: everything one loop iteration decided (an ordered batch of events, the
rejection records of bad submissions, and the leader's position in `dispatch.submit`) commits
in one Kafka transaction. The position rides in the last events record of the commit (its
`submit` field), not in the consumer group: a submission is therefore consumed exactly when
its `enqueued` event is durable, and a new leader reads on from the position the log's last
batch carries. `send_offsets_to_transaction` costs two more sequential round trips per
transaction (AddOffsetsToTxn, TxnOffsetCommit: 13 -> 7 ms p50 per commit here), so the group's
offsets are sent with a transaction only about once a second, for the tools that read them
(`kafka-consumer-groups`); they are never ahead of the log's position, and a new leader starts
from whichever of the two is further. A leader that dies mid-iteration leaves nothing
half-done. All leaders of one group share one `transactional_id`, so `init_transactions` by a
new leader fences the old one: its next commit fails, and it must step down.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from dispatch.event_records import EventBatch, decode_batch
from dispatch.settings import KafkaSettings


def submit_group_id(group: str) -> str:
    """The consumer group whose committed offsets say (up to a second late) which submissions
    were consumed."""
    return f"dispatch-{group}-leader"


def transactional_id(group: str) -> str:
    """Shared by every leader of a group: a new leader's init fences the previous one."""
    return f"dispatch-{group}-leader"


@dataclass(frozen=True, slots=True)
class SubmitRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class SubmitReader:
    """Reads `dispatch.submit` (read_committed) from the position the last commit recorded.

    `position` is the position the rebuild found in the events log; the group's committed
    offsets count too (a log written before positions were carried has only those), and the
    further of the two wins. Partitions known to neither start at their beginning."""

    def __init__(
        self,
        kafka: KafkaSettings,
        group: str,
        *,
        client_id: str,
        position: Mapping[int, int] | None = None,
    ) -> None:
        self.topic = kafka.submit_topic
        self._consumer = KafkaConsumer(
            bootstrap_servers=kafka.bootstrap,
            group_id=submit_group_id(group),
            client_id=client_id,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            max_poll_records=5000,
            # A long-poll fetch: the broker answers as soon as a submission arrives, so the
            # answer is waiting when the loop's commit ends. With a short wait (5 ms) the
            # broker answered "nothing" during the commit and a submission arriving later
            # waited for the next iteration's fetch: ~2 iterations instead of ~1.
            fetch_max_wait_ms=500,
        )
        partitions = self._consumer.partitions_for_topic(self.topic)
        if not partitions:
            self._consumer.close()
            raise RuntimeError(f"topic {self.topic!r} does not exist: run `dispatch up`")
        # Manual assignment, no group membership: there is one reader per group (the leader),
        # and a failover must not wait for a rebalance. The committed offsets still live in
        # the group, written by the event log's transactions.
        self._partitions = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self._consumer.assign(self._partitions)
        beginning = self._consumer.beginning_offsets(self._partitions)
        carried = position or {}
        self.position: dict[int, int] = {}
        """Partition -> the offset of the next submission to read: what a commit records."""
        for partition in self._partitions:
            committed = self._consumer.committed(partition)
            start = max(
                beginning[partition],
                carried.get(partition.partition, 0),
                committed if committed is not None else 0,
            )
            self._consumer.seek(partition, start)
            self.position[partition.partition] = start
        self._moved = False

    def poll(self, timeout_ms: int) -> list[SubmitRecord]:
        polled = self._consumer.poll(timeout_ms=timeout_ms)
        records: list[SubmitRecord] = []
        for partition, batch in polled.items():
            for record in batch:
                records.append(
                    SubmitRecord(partition.partition, record.offset, record.key, record.value)
                )
            self.position[partition.partition] = batch[-1].offset + 1
            self._moved = True
        return records

    def take_moved(self) -> bool:
        """Whether `poll` consumed anything since the last call (the position must be
        committed before the next iteration's answers)."""
        moved, self._moved = self._moved, False
        return moved

    def close(self) -> None:
        self._consumer.close()


class EventLog:
    """The leader's transactional producer on `dispatch.events` (and the rejected topic)."""

    def __init__(self, kafka: KafkaSettings, group: str, *, client_id: str) -> None:
        self.kafka = kafka
        self.group = group
        self._producer = KafkaProducer(
            bootstrap_servers=kafka.bootstrap,
            client_id=client_id,
            transactional_id=transactional_id(group),
            acks="all",
            enable_idempotence=True,
            linger_ms=0,
            max_request_size=16 * 1024 * 1024,
            transaction_timeout_ms=15_000,
            max_block_ms=15_000,
            # A transaction that starts right after the previous one committed is refused with
            # CONCURRENT_TRANSACTIONS until the broker has written the previous one's markers
            # (a millisecond or two); kafka-python then waits `retry_backoff_ms` before asking
            # again, 100 ms by default, for AddOffsetsToTxn every time. With one transaction per
            # loop iteration that wait was most of the commit (a lone loop: 115 ms per
            # transaction at 100 ms, 11.5 ms at 2 ms). Connection failures keep their own
            # growing backoff (`reconnect_backoff_ms`).
            retry_backoff_ms=2,
        )
        # Fences every earlier producer of this group and aborts its open transaction, so
        # what the replay reads next is everything the old leader ever committed.
        self._producer.init_transactions()

    def commit(
        self,
        events_records: Sequence[bytes],
        rejections: Sequence[bytes],
        group_offsets: Mapping[int, int] | None = None,
    ) -> None:
        """One transaction: the events records (the last one carrying the submit position),
        the rejections, and, when given, the submit position as the group's offsets.

        Raises a KafkaError on failure (ProducerFencedError when a newer leader took over):
        the caller's in-memory state is then ahead of the log and must be rebuilt."""
        producer = self._producer
        producer.begin_transaction()
        for record in events_records:
            producer.send(self.kafka.events_topic, key=self.group.encode(), value=record)
        for rejection in rejections:
            producer.send(self.kafka.rejected_topic, value=rejection)
        if group_offsets:
            topic = self.kafka.submit_topic
            producer.send_offsets_to_transaction(
                {
                    TopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)
                    for partition, offset in group_offsets.items()
                },
                submit_group_id(self.group),
            )
        producer.commit_transaction()

    def close(self) -> None:
        self._producer.close(timeout=5)


class SnapshotBehindLog(Exception):
    """The log no longer holds the records right after the snapshot (retention removed them)."""


class EventsReader:
    """A read_committed reader of `dispatch.events` outside any group, for one rebuild: the
    log after a snapshot (`replay`) and, when that tail carries no submit position, the
    position before it (`last_submit_position`), over one consumer (starting one costs about
    0.1 s of a failover; most failovers now find a snapshot with no tail and need both)."""

    def __init__(self, kafka: KafkaSettings, *, client_id: str) -> None:
        self.topic = kafka.events_topic
        self._consumer = KafkaConsumer(
            bootstrap_servers=kafka.bootstrap,
            client_id=client_id,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            max_poll_records=2000,
        )
        self._partitions = [
            TopicPartition(self.topic, p)
            for p in sorted(self._consumer.partitions_for_topic(self.topic) or ())
        ]
        if not self._partitions:
            self._consumer.close()
            raise RuntimeError(f"topic {self.topic!r} does not exist: run `dispatch up`")

    def __enter__(self) -> EventsReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._consumer.close()

    def replay(
        self, start: Mapping[int, int] | None = None, *, stall_timeout_s: float = 120.0
    ) -> Iterator[EventBatch]:
        """Every committed batch from `start` (partition -> offset; absent partitions and
        `None` mean the beginning) to the current end.

        Call after `EventLog` init (which aborted any open transaction of a dead leader), so
        the end read here is final until this leader writes. Raises SnapshotBehindLog when a
        start offset is below what the log still holds, and TimeoutError when nothing arrives
        for `stall_timeout_s` (a long log may take minutes: only a stalled read is an error)."""
        consumer, partitions = self._consumer, self._partitions
        consumer.assign(partitions)
        beginning = consumer.beginning_offsets(partitions)
        for partition in partitions:
            offset = (start or {}).get(partition.partition)
            if offset is None:
                consumer.seek(partition, beginning[partition])
            elif offset < beginning[partition]:
                raise SnapshotBehindLog(
                    f"{partition.topic}[{partition.partition}] starts at "
                    f"{beginning[partition]}, after the snapshot's offset {offset}"
                )
            else:
                consumer.seek(partition, offset)
        end = consumer.end_offsets(partitions)
        deadline = time.monotonic() + stall_timeout_s
        while any(consumer.position(p) < end[p] for p in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"replaying {self.topic}: nothing read for {stall_timeout_s:.0f}s"
                )
            for batch in consumer.poll(timeout_ms=500).values():
                deadline = time.monotonic() + stall_timeout_s
                for record in batch:
                    if record.value is not None:
                        yield decode_batch(record.value)

    def last_submit_position(
        self,
        group: str,
        *,
        before: Mapping[int, int],
        window: int = 64,
        stall_timeout_s: float = 30.0,
    ) -> dict[int, int] | None:
        """The submit position carried by `group`'s last events record before the offsets
        `before` (events partition -> offset), or None if no record before them carries one.

        A rebuild from a snapshot whose tail holds no position (nothing committed since the
        snapshot) needs the position as it was at the snapshot: it is in the group's last
        record before it, usually among the last few offsets. The read goes backwards in
        windows of `window` offsets, four times wider each time, down to the log's beginning;
        it stops at the first window holding records of the group but no position (a log
        written before positions were carried: the group's offsets say where reading goes
        on), so it never reads a long legacy log back to its start."""
        consumer = self._consumer
        beginning = consumer.beginning_offsets(self._partitions)
        for partition in self._partitions:
            end = before.get(partition.partition)
            if end is None:
                continue
            consumer.assign([partition])  # read only this one, not the others from the start
            low, width = end, window
            while low > beginning[partition]:
                high, low = low, max(beginning[partition], low - width)
                found, seen = self._last_position_in(partition, group, low, high, stall_timeout_s)
                if found is not None or seen:
                    return found
                width *= 4
        return None

    def _last_position_in(
        self, partition: TopicPartition, group: str, low: int, high: int, stall_timeout_s: float
    ) -> tuple[dict[int, int] | None, bool]:
        """The last position `group` carried in `partition`'s offsets [low, high), and
        whether any record of `group` is there."""
        consumer = self._consumer
        consumer.seek(partition, low)
        found: dict[int, int] | None = None
        seen = False
        deadline = time.monotonic() + stall_timeout_s
        while consumer.position(partition) < high:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {self.topic}[{partition.partition}] back stalled")
            for record in consumer.poll(timeout_ms=500).get(partition, []):
                deadline = time.monotonic() + stall_timeout_s
                if record.offset < high and record.value is not None:
                    batch = decode_batch(record.value)
                    if batch.group == group:
                        seen = True
                        if batch.submit is not None:
                            found = batch.submit
        return found, seen


def replay_events(
    kafka: KafkaSettings,
    *,
    client_id: str,
    start: Mapping[int, int] | None = None,
    stall_timeout_s: float = 120.0,
) -> Iterator[EventBatch]:
    """`EventsReader.replay` on a reader of its own (audits, benchmarks, tests)."""
    with EventsReader(kafka, client_id=client_id) as reader:
        yield from reader.replay(start, stall_timeout_s=stall_timeout_s)

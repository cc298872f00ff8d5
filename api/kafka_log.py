"""The leader's Kafka adapter: the submit reader, the transactional event log, and replay.

Write-ahead, for real: everything one loop iteration decided (an ordered batch of events, the
rejection records of bad submissions, and the leader's position in `dispatch.submit`) commits
in one Kafka transaction. The position rides in the last events record of the commit (its
`submit` field), not in the consumer group: a submission is therefore consumed exactly when
its `enqueued` event is durable, and a new leader reads on from the position the log's last
batch carries. `send_offsets_to_transaction` costs two more sequential round trips per
transaction (AddOffsetsToTxn, TxnOffsetCommit), which doubled the commit every submission
waits for (BENCHMARKS.md, *End to end*), so the group's offsets are sent with a transaction
only about once a second, for the tools that read them (`kafka-consumer-groups`); they are
never ahead of the log's position, and a new leader starts from whichever of the two is
further. A leader that dies mid-iteration leaves nothing
half-done. All leaders of one group share one `transactional_id`, so `init_transactions` by a
new leader fences the old one: its next commit fails, and it must step down.

Deadlines: every call the leader's loop makes to Kafka returns within `KAFKA_CALL_DEADLINE_S`
(kafka-python's `commit_transaction` and `send_offsets_to_transaction` wait without one, so
`EventLog` waits on their results itself); one that times out raises `KafkaTimeoutError`,
which fails the term like any failed commit. Every client reconnects at most
`RECONNECT_BACKOFF_MAX_MS` after the broker comes back (kafka-python's default grows to 30 s).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from kafka.net.compat import KafkaNetClient
from kafka.structs import OffsetAndMetadata

from dispatch.api.prefetch import Prefetcher
from dispatch.event_records import EventBatch, decode_batch
from dispatch.settings import KafkaSettings

log = logging.getLogger(__name__)

KAFKA_CALL_DEADLINE_S = 5.0
"""The longest any Kafka call of the leader's loop may block (a commit, a poll, a probe)."""

FETCH_WAIT_MS = 100
"""The longest one poll of the submit reader's fetch thread waits for records (it returns as
soon as some arrive): also the longest a term's end waits for that thread."""

BROKER_PROBE_TIMEOUT_MS = 500
"""A probe of an idle loop (`SubmitReader.broker_answers`): a healthy broker answers in ~1 ms
(on a connection of its own: see `SubmitReader`)."""

RECONNECT_BACKOFF_MAX_MS = 500
"""The longest pause between two connection attempts to a broker that does not answer.
kafka-python's default doubles the pause up to 30 s: after a broker restart of ~15 s, clients
stayed away for up to 30 s more. Not shorter: kafka-python 3.0.12 leaves each refused
connection's socket to the garbage collector (a ResourceWarning each), and logs two lines."""

RECONNECT = {
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
}
"""kafka-python options every client of the dispatcher passes (`dispatch.api.node` too)."""


def check_durable(sends: Sequence[Any], *, began_as: Any, ended_as: Any) -> None:
    """Raise unless every record of a committed transaction is in the log.

    kafka-python recovers from some produce errors (InvalidProducerEpoch, seen when a paused
    leader woke up) by bumping the producer's epoch, which aborts the open transaction and
    fails its in-flight records' futures, and then lets the *commit* succeed with nothing in
    it. A leader that believed that commit kept decisions the log never got (in a chaos run:
    jobs completed that were never enqueued in the log). So a commit counts only if the
    producer's id and epoch are those it began with, and every send landed (the commit is
    sent only once no record is in flight, so each send's future is done by then)."""
    if ended_as != began_as:
        raise KafkaError(
            f"the producer moved from {began_as} to {ended_as} during the transaction: "
            "it was aborted"
        )
    for sent in sends:
        if not sent.succeeded():
            raise KafkaError(f"a record of the transaction was not written: {sent.exception!r}")


class CoordinatorRetryingClient(KafkaNetClient):  # type: ignore[misc]
    """The event log producer's network client (kafka-python's `kafka_client` option): says
    "not ready" for a node it cannot connect to, where kafka-python's own client raises.

    kafka-python 3.0.12's sender asks whether the coordinator is ready before it sends a
    transactional request, and treats "not ready" as "look the coordinator up again and retry
    the request"; but on the exception its own client raises for a node it cannot connect to,
    the sender looks the coordinator up and forgets the request. When the broker coordinating
    the leader's transactions was killed, the open transaction's AddPartitionsToTxn was
    forgotten: its records waited for a partition never added, the commit for the records,
    and the term ended at the commit's deadline (5 s), with a rebuild after it. Answering
    "not ready" keeps the request queued behind the coordinator's lookup, which the cluster
    answers with a live broker once the dead one's session expired (~2 s): the transaction
    goes on in the same term."""

    def await_ready(self, node_id: Any, timeout_ms: int = 30_000) -> bool:
        try:
            return bool(super().await_ready(node_id, timeout_ms=timeout_ms))
        except KafkaConnectionError:
            return False


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
            request_timeout_ms=int(KAFKA_CALL_DEADLINE_S * 1000),
            **RECONNECT,
        )
        # The probe's own client: on the reader's connection, the probe's ListOffsets queued
        # behind the long-poll fetch (a broker answers one request of a connection at a
        # time), so each probe stalled the loop up to `fetch_max_wait_ms`.
        # The reader already learnt the broker's version: given it, kafka-python skips its
        # bootstrap round trip, which would otherwise lengthen every term's start.
        self._probe = KafkaConsumer(
            bootstrap_servers=kafka.bootstrap,
            client_id=f"{client_id}-probe",
            api_version=self._consumer.config["api_version"],
            request_timeout_ms=int(KAFKA_CALL_DEADLINE_S * 1000),
            **RECONNECT,
        )
        partitions = self._consumer.partitions_for_topic(self.topic)
        if not partitions:
            self.close()
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
            committed = self._consumer.committed(
                partition, timeout_ms=int(KAFKA_CALL_DEADLINE_S * 1000)
            )
            start = max(
                beginning[partition],
                carried.get(partition.partition, 0),
                committed if committed is not None else 0,
            )
            self._consumer.seek(partition, start)
            self.position[partition.partition] = start
        self._moved = False
        # From here on only the fetch thread touches the consumer (kafka-python's consumer is
        # not thread-safe): the loop waits on the prefetcher, which its commands can wake.
        self._fetcher: Prefetcher[dict[TopicPartition, list[Any]]] = Prefetcher(
            self._fetch, name=f"{client_id}-fetch"
        )
        self._fetcher.start()

    def _fetch(self) -> dict[TopicPartition, list[Any]] | None:
        return self._consumer.poll(timeout_ms=FETCH_WAIT_MS) or None

    def poll(self, timeout_ms: int) -> list[SubmitRecord]:
        polled = self._fetcher.take(timeout_ms / 1000) or {}
        records: list[SubmitRecord] = []
        for partition, batch in polled.items():
            for record in batch:
                records.append(
                    SubmitRecord(partition.partition, record.offset, record.key, record.value)
                )
            self.position[partition.partition] = batch[-1].offset + 1
            self._moved = True
        return records

    def broker_answers(self) -> bool:
        """Whether the broker answers a small request (the end offsets of the submit
        partitions) within `BROKER_PROBE_TIMEOUT_MS`."""
        try:
            self._probe.end_offsets(self._partitions, timeout_ms=BROKER_PROBE_TIMEOUT_MS)
        except KafkaError:
            return False
        return True

    def take_moved(self) -> bool:
        """Whether `poll` consumed anything since the last call (the position must be
        committed before the next iteration's answers)."""
        moved, self._moved = self._moved, False
        return moved

    def wake(self) -> None:
        self._fetcher.wake()

    def close(self) -> None:
        if not self._fetcher.close(KAFKA_CALL_DEADLINE_S):
            log.warning(
                "the submit reader's fetch did not return within %ss", KAFKA_CALL_DEADLINE_S
            )
        self._consumer.close()
        self._probe.close()


class EventLog:
    """The leader's transactional producer on `dispatch.events` (and the rejected topic)."""

    def __init__(self, kafka: KafkaSettings, group: str, *, client_id: str) -> None:
        self.kafka = kafka
        self.group = group
        self._producer = KafkaProducer(
            bootstrap_servers=kafka.bootstrap,
            client_id=client_id,
            transactional_id=transactional_id(group),
            kafka_client=CoordinatorRetryingClient,
            acks="all",
            enable_idempotence=True,
            linger_ms=0,
            max_request_size=16 * 1024 * 1024,
            transaction_timeout_ms=15_000,
            # Bounds `send` (waiting for metadata) and `init_transactions`.
            max_block_ms=int(KAFKA_CALL_DEADLINE_S * 1000),
            request_timeout_ms=int(KAFKA_CALL_DEADLINE_S * 1000),
            **RECONNECT,
            # A transaction that starts right after the previous one committed is refused with
            # CONCURRENT_TRANSACTIONS until the broker has written the previous one's markers
            # (a millisecond or two); kafka-python then waits `retry_backoff_ms` before asking
            # again, 100 ms by default, for AddOffsetsToTxn every time. With one transaction per
            # loop iteration that wait was most of the commit (a lone loop of transactions
            # was ten times faster at 2 ms: BENCHMARKS-history.md, *End to end*). Connection
            # failures keep their own growing backoff (`reconnect_backoff_ms`).
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
        deadline = time.monotonic() + KAFKA_CALL_DEADLINE_S
        producer = self._producer
        manager = producer._transaction_manager
        identity = manager.producer_id_and_epoch
        producer.begin_transaction()
        sends = [
            producer.send(self.kafka.events_topic, key=self.group.encode(), value=record)
            for record in events_records
        ]
        sends += [producer.send(self.kafka.rejected_topic, value=record) for record in rejections]
        # What `send_offsets_to_transaction` and `commit_transaction` do, but waiting for the
        # broker's answer only until the deadline (kafka-python waits forever: a leader whose
        # broker restarted mid-commit once answered /readyz 200 and did nothing for 85 s).
        if group_offsets:
            topic = self.kafka.submit_topic
            offsets = {
                TopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)
                for partition, offset in group_offsets.items()
            }
            sent = manager.send_offsets_to_transaction(offsets, submit_group_id(self.group))
            self._wait(sent, "sending the group's offsets", deadline)
        self._wait(manager.begin_commit(), "committing the transaction", deadline)
        check_durable(sends, began_as=identity, ended_as=manager.producer_id_and_epoch)

    def _wait(self, result: Any, what: str, deadline: float) -> None:
        """Wait for a transactional request's result until `deadline` (monotonic); raises
        its error, or KafkaTimeoutError. The producer is unusable after a timeout: the term
        that owns it ends (and a new term's `init_transactions` aborts what was open)."""
        self._producer._sender.wakeup()
        remaining_ms = max(0.0, deadline - time.monotonic()) * 1000
        if not result.wait(timeout_ms=remaining_ms):
            raise KafkaTimeoutError(f"{what}: no answer within {KAFKA_CALL_DEADLINE_S:.0f}s")

    def close(self) -> None:
        """Close at once: every transaction of a working term is committed, so nothing is
        left to flush; a failed term's open transaction is garbage (its records are never
        read, and the next `init_transactions` aborts it)."""
        producer = self._producer
        try:
            producer.close(timeout=0)
        except KafkaTimeoutError:
            # kafka-python's close gives up at a flush that timed out (records of an open
            # transaction, the broker gone) before it stops its sender thread, and tries
            # again, noisily, when the producer is collected: stop the sender and mark it
            # closed here.
            producer._sender.force_close()
            producer._closed = True


class SnapshotBehindLog(Exception):
    """The log no longer holds the records right after the snapshot (retention removed them):
    `topic`[`partition`] starts at `log_start`, after the snapshot's `snapshot_offset`."""

    def __init__(self, topic: str, partition: int, snapshot_offset: int, log_start: int) -> None:
        super().__init__(
            f"{topic}[{partition}] starts at {log_start}, after the snapshot's offset "
            f"{snapshot_offset}: offsets {snapshot_offset}..{log_start - 1} are gone"
        )
        self.topic = topic
        self.partition = partition
        self.snapshot_offset = snapshot_offset
        self.log_start = log_start


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
            request_timeout_ms=int(KAFKA_CALL_DEADLINE_S * 1000),
            **RECONNECT,
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
        self.close()

    def close(self) -> None:
        self._consumer.close()

    def replay(
        self,
        start: Mapping[int, int] | None = None,
        *,
        stall_timeout_s: float = 120.0,
        complete: bool = False,
    ) -> Iterator[EventBatch]:
        """Every committed batch from `start` (partition -> offset; absent partitions and
        `None` mean the beginning) to the current end.

        Call after `EventLog` init (which aborted any open transaction of a dead leader), so
        the end read here is final until this leader writes. Raises SnapshotBehindLog when a
        start offset is below what the log still holds (with `complete`, "the beginning" means
        offset 0: a rebuild needs the whole log, not what retention left of it), and
        TimeoutError when nothing arrives for `stall_timeout_s` (a long log may take minutes:
        only a stalled read is an error)."""
        consumer, partitions = self._consumer, self._partitions
        consumer.assign(partitions)
        beginning = consumer.beginning_offsets(partitions)
        for partition in partitions:
            offset = (start or {}).get(partition.partition)
            if offset is None and complete:
                offset = 0
            if offset is None:
                consumer.seek(partition, beginning[partition])
            elif offset < beginning[partition]:
                raise SnapshotBehindLog(
                    partition.topic, partition.partition, offset, beginning[partition]
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
                    if record.value is None:
                        continue
                    try:
                        decoded = decode_batch(record.value)
                    except ValueError as error:
                        # Not a leader's record (only leaders may write this topic): skipped
                        # and named, as the streaming fold skips it, never a failed rebuild.
                        log.error(
                            "replaying %s: skipped the record at %d/%d: %s",
                            self.topic, record.partition, record.offset, error,
                        )  # fmt: skip
                        continue
                    yield decoded

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

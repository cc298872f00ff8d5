"""The leader's reader of `dispatch.submit` on librdkafka (confluent-kafka): `SubmitReader`'s twin.

Same contract as `dispatch.api.kafka_log.SubmitReader` (`dispatch.api.leader_io.SubmitSource`):
read_committed from the position the last commit recorded (or the group's committed offsets,
whichever is further), manual assignment (no group membership, so a failover never waits for
a rebalance), a fetch thread (`dispatch.api.prefetch.Prefetcher`) the loop waits on together
with its commands, and a liveness probe on a client of its own.

Why a second one: kafka-python's fetcher decodes every record batch in Python under the
node's GIL, beside the loop and the HTTP server; librdkafka fetches and decodes in C threads
and hands over finished messages. `kafka.leader_client` chooses, with the event log.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from dispatch.api.kafka_log import (
    BROKER_PROBE_TIMEOUT_MS,
    FETCH_WAIT_MS,
    KAFKA_CALL_DEADLINE_S,
    RECONNECT_BACKOFF_MAX_MS,
    SubmitRecord,
    submit_group_id,
)
from dispatch.api.prefetch import Prefetcher
from dispatch.settings import KafkaSettings

log = logging.getLogger(__name__)

MAX_RECORDS_PER_FETCH = 5000
"""Submissions handed to the loop at most per fetch (kafka-python's `max_poll_records`)."""


class RdkafkaSubmitReader:
    """Reads `dispatch.submit` (read_committed) from the position the last commit recorded."""

    def __init__(
        self,
        kafka: KafkaSettings,
        group: str,
        *,
        client_id: str,
        position: Mapping[int, int] | None = None,
    ) -> None:
        self.topic = kafka.submit_topic
        common = {
            "bootstrap.servers": kafka.bootstrap,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
            "socket.timeout.ms": int(KAFKA_CALL_DEADLINE_S * 1000),
            "logger": log,
        }
        self._consumer = Consumer(
            {
                **common,
                "client.id": client_id,
                "group.id": submit_group_id(group),
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                # A long-poll fetch, as `SubmitReader`'s: the broker answers as soon as a
                # submission arrives.
                "fetch.wait.max.ms": 500,
                # librdkafka fetches ahead into its own queue; one fetch's worth is enough.
                "queued.max.messages.kbytes": 16 * 1024,
            }
        )
        # The probe's own client, as `SubmitReader`'s: on the reader's connection it would
        # queue behind the long-poll fetch.
        # (librdkafka's consumer needs a group id; the probe never joins nor commits.)
        self._probe = Consumer(
            {**common, "client.id": f"{client_id}-probe", "group.id": f"{client_id}-probe"}
        )
        try:
            metadata = self._consumer.list_topics(self.topic, timeout=KAFKA_CALL_DEADLINE_S)
            described = metadata.topics.get(self.topic)
            partitions = sorted(described.partitions) if described and not described.error else []
            if not partitions:
                raise RuntimeError(f"topic {self.topic!r} does not exist: run `dispatch up`")
            self.position: dict[int, int] = self._start(partitions, position or {})
            """Partition -> the offset of the next submission to read: what a commit records."""
        except BaseException:
            self._consumer.close()
            self._probe.close()
            raise
        self._partitions = [TopicPartition(self.topic, p) for p in partitions]
        self._consumer.assign(
            [TopicPartition(self.topic, p, offset) for p, offset in self.position.items()]
        )
        self._moved = False
        self._fetcher: Prefetcher[list[SubmitRecord]] = Prefetcher(
            self._fetch, name=f"{client_id}-fetch"
        )
        self._fetcher.start()

    def _start(self, partitions: list[int], carried: Mapping[int, int]) -> dict[int, int]:
        """Where each partition starts: the further of the log's position, the group's
        committed offset and the partition's beginning."""
        committed = self._consumer.committed(
            [TopicPartition(self.topic, p) for p in partitions], timeout=KAFKA_CALL_DEADLINE_S
        )
        by_partition = {
            tp.partition: tp.offset for tp in committed if tp.error is None and tp.offset >= 0
        }
        start: dict[int, int] = {}
        for partition in partitions:
            low, _high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=KAFKA_CALL_DEADLINE_S
            )
            start[partition] = max(
                low, carried.get(partition, 0), by_partition.get(partition, OFFSET_INVALID)
            )
        return start

    def _fetch(self) -> list[SubmitRecord] | None:
        # `consume` waits for its whole count or its timeout, whichever comes last to a
        # trickle: wait for the first message alone, then take what is already here.
        first = self._consumer.poll(FETCH_WAIT_MS / 1000)
        if first is None:
            return None
        messages = [first, *self._consumer.consume(MAX_RECORDS_PER_FETCH - 1, 0)]
        records = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                # Connection trouble and the like: librdkafka retries by itself.
                log.debug("submit reader: %s", error)
                continue
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            records.append(SubmitRecord(partition, offset, message.key(), message.value()))
        return records or None

    def poll(self, timeout_ms: int) -> list[SubmitRecord]:
        records = self._fetcher.take(timeout_ms / 1000) or []
        for record in records:
            self.position[record.partition] = record.offset + 1
        if records:
            self._moved = True
        return records

    def broker_answers(self) -> bool:
        """Whether the broker answers a small request (the end offsets of a submit partition)
        within `BROKER_PROBE_TIMEOUT_MS`."""
        try:
            self._probe.get_watermark_offsets(
                self._partitions[0], timeout=BROKER_PROBE_TIMEOUT_MS / 1000
            )
        except KafkaException:
            return False
        return True

    def take_moved(self) -> bool:
        moved, self._moved = self._moved, False
        return moved

    def wake(self) -> None:
        self._fetcher.wake()

    def close(self) -> None:
        if not self._fetcher.close(KAFKA_CALL_DEADLINE_S):
            log.warning(
                "the submit reader's fetch did not return within %ss", KAFKA_CALL_DEADLINE_S
            )
        for client in (self._consumer, self._probe):
            try:
                client.close()
            except Exception as error:  # noqa: BLE001  (closing must not fail a term's end)
                log.debug("closing the submit reader: %r", error)

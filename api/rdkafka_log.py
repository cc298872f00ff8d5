"""The leader's transactional event log on librdkafka (confluent-kafka): `EventLog`'s twin.

Same contract as `dispatch.api.kafka_log.EventLog` (`dispatch.api.leader_io.TransactionalLog`):
one transaction per call holding the events records and the rejections; the submit group's
offsets, when given, follow the transaction through the admin API (see `__init__`); opening
one fences every earlier producer of the group (all leaders of a group share one
`transactional_id`), so a deposed leader's next commit fails.

Why a second one: a transaction costs the broker the same whichever client asks for it, but
kafka-python runs its protocol work (the sender thread, the transaction manager's requests) in
Python, under the leader node's GIL, beside the loop and the HTTP server; librdkafka runs it in
C threads that never take the GIL. Measured on one broker, one record a transaction: ~0.5 ms
of the client's CPU a transaction against ~1.5-1.9 ms (BENCHMARKS.md, *The leader's log on
librdkafka*). `kafka.leader_client` chooses; the fencing and chaos tests run on both.

Deadlines: every call here returns within `KAFKA_CALL_DEADLINE_S` (librdkafka's transactional
calls take a timeout); a failure of any kind raises `KafkaException`, which fails the term
like any failed commit (a fenced producer's error is fatal: its term is over), and the next
term's `init_transactions` aborts what was left open.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from dispatch.api.kafka_log import (
    KAFKA_CALL_DEADLINE_S,
    RECONNECT_BACKOFF_MAX_MS,
    submit_group_id,
    transactional_id,
)
from dispatch.settings import KafkaSettings

log = logging.getLogger(__name__)

OFFSETS_CLOSE_WAIT_S = 1.0
"""How long closing waits for the last offsets sent to the group."""

MAX_RECORD_BYTES = 16 * 1024 * 1024
"""The largest events record the leader writes (a big batch's events), as `EventLog` allows."""


class RdkafkaEventLog:
    """The leader's transactional producer on `dispatch.events` (and the rejected topic)."""

    def __init__(self, kafka: KafkaSettings, group: str, *, client_id: str) -> None:
        self.kafka = kafka
        self.group = group
        self._key = group.encode()
        deadline_ms = int(KAFKA_CALL_DEADLINE_S * 1000)
        self._producer = Producer(
            {
                "bootstrap.servers": kafka.bootstrap,
                "client.id": client_id,
                "transactional.id": transactional_id(group),
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 0,
                "message.max.bytes": MAX_RECORD_BYTES + 1024 * 1024,
                "transaction.timeout.ms": 15_000,
                # A record not acknowledged within the call deadline fails its commit (and
                # the term), as `EventLog`'s deadline does.
                "message.timeout.ms": deadline_ms,
                "socket.timeout.ms": deadline_ms,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
                # librdkafka waits `retry.backoff.ms` (100 ms) before asking again when a new
                # transaction meets CONCURRENT_TRANSACTIONS (the previous one's markers not yet
                # written): the same wait `EventLog` takes down to 2 ms.
                "retry.backoff.ms": 2,
                "retry.backoff.max.ms": 100,
                "error_cb": self._on_error,
                # librdkafka's own log lines go to this module's logger, not to stderr.
                "logger": log,
            }
        )
        # The group's offsets go through the admin API after the transaction that carried
        # the same position, not inside it: librdkafka's `send_offsets_to_transaction` can
        # block past its timeout while the group's coordinator is away (librdkafka issue
        # 5456; a broker restart left a term stuck in it for good).
        self._admin = AdminClient(
            {
                "bootstrap.servers": kafka.bootstrap,
                "client.id": f"{client_id}-offsets",
                "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
                "logger": log,  # type: ignore[dict-item]
            }
        )
        self._offsets_sent: Future[Any] | None = None
        # Fences every earlier producer of this group and aborts its open transaction, so
        # what the replay reads next is everything the old leader ever committed.
        self._producer.init_transactions(KAFKA_CALL_DEADLINE_S)

    @staticmethod
    def _on_error(error: object) -> None:
        # librdkafka reports connection trouble here and retries by itself; a commit that
        # cannot complete raises from `commit_transaction`, which is what fails a term.
        log.debug("leader's event log: %s", error)

    def commit(
        self,
        events_records: Sequence[bytes],
        rejections: Sequence[bytes],
        group_offsets: Mapping[int, int] | None = None,
    ) -> None:
        """One transaction: the events records (the last one carrying the submit position),
        the rejections, and, when given, the submit position as the group's offsets.

        Raises KafkaException on failure (fenced when a newer leader took over): the caller's
        in-memory state is then ahead of the log and must be rebuilt."""
        producer = self._producer
        producer.begin_transaction()
        events_topic = self.kafka.events_topic
        key = self._key
        for record in events_records:
            producer.produce(events_topic, value=record, key=key)
        rejected_topic = self.kafka.rejected_topic
        for record in rejections:
            producer.produce(rejected_topic, value=record)
        # Flushes every record and fails if any was not acknowledged: nothing of a failed
        # commit is ever read (read_committed), and the term ends.
        producer.commit_transaction(KAFKA_CALL_DEADLINE_S)
        if group_offsets:
            self._send_group_offsets(group_offsets)

    def _send_group_offsets(self, group_offsets: Mapping[int, int]) -> None:
        """The group's offsets, for the tools that read them, without waiting for the answer:
        they follow the log's position (never ahead of it), and a lost update is made good
        by the next (about a second later)."""
        topic = self.kafka.submit_topic
        request = ConsumerGroupTopicPartitions(
            submit_group_id(self.group),
            [
                TopicPartition(topic, partition, offset)
                for partition, offset in group_offsets.items()
            ],
        )
        try:
            [sent] = self._admin.alter_consumer_group_offsets(
                [request], request_timeout=KAFKA_CALL_DEADLINE_S
            ).values()
        except KafkaException as error:
            log.warning("the submit group's offsets were not sent: %r", error)
            return
        self._offsets_sent = sent

    def _close_producer(self) -> None:
        try:
            self._producer.purge()
            self._producer.close()
        except Exception as error:  # noqa: BLE001  (a fenced producer's close raises SystemError)
            log.debug("closing the leader's event log: %r", error)

    def close(self) -> None:
        """Close within `KAFKA_CALL_DEADLINE_S` at most: every transaction of a working term is
        committed, so nothing is left to flush; a failed term's open transaction is aborted
        by the next term's `init_transactions`."""
        # Dropped first, so that `close` (which aborts an open transaction and flushes) has
        # nothing to wait for; and on a thread of its own, since it takes no timeout: a broker
        # that hangs without dying must not hold the end of a term (the next term's
        # `init_transactions` fences this producer whatever it is still doing).
        closing = threading.Thread(
            target=self._close_producer, name="dispatch-event-log-close", daemon=True
        )
        closing.start()
        closing.join(KAFKA_CALL_DEADLINE_S)
        if closing.is_alive():
            log.warning("the leader's event log did not close within %ss", KAFKA_CALL_DEADLINE_S)
        sent = self._offsets_sent
        if sent is not None:
            # The last offsets of a term that ends in order reach the group (a tool reading
            # them next sees where the term stopped); a failed one is not waited for long.
            with contextlib.suppress(Exception):
                sent.result(timeout=OFFSETS_CLOSE_WAIT_S)

"""The node's producer on `dispatch.submit`: librdkafka (confluent-kafka), not kafka-python.

Every REST submission waits for its record's acknowledgement (acks=all, idempotent) before
its 202, so this producer's round trip is the floor of a single-job request. kafka-python's
sender thread runs Python under the node's GIL, beside its event loop; librdkafka's I/O
threads are C and never take it. `bench/producer_bench.py` measures both on the same broker
(BENCHMARKS.md, *The submit path*: several times shorter round trips, one record at a time or
64 waiting at once). The leader's transactional event log and its submit reader are on
librdkafka too (`dispatch.api.rdkafka_log`, `dispatch.api.rdkafka_submit_reader`).

Threads: librdkafka runs its own; one Python thread (`dispatch-submit-poll`) serves delivery
reports (`poll`), which resolve each request's future on its event loop, once per request
rather than once per record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from dispatch.api.kafka_log import RECONNECT_BACKOFF_MAX_MS
from dispatch.core.commands import SubmitRequest
from dispatch.settings import KafkaSettings
from dispatch.submit_records import submit_record_value

log = logging.getLogger(__name__)

DELIVERY_TIMEOUT_MS = 30_000
"""How long a submission may wait for Kafka's acknowledgement (a broker down, a leader
election of the partition) before its request is answered 503: about the SDK's request
timeout, after which it retries with the same id anyway (the dedup check answers a repeat)."""

METADATA_RETRY_BACKOFF_MAX_MS = 200
"""The longest wait between two metadata refreshes while a partition has no known leader."""

POLL_S = 0.1
"""The delivery-report thread's wait; a report wakes it at once, so this only bounds close."""


class SubmitUnavailable(Exception):
    """Kafka did not take a submission (it timed out, or the producer's queue is full)."""


class _Pending:
    """One request's records: settles its future when the last is acknowledged, or at the
    first that failed."""

    __slots__ = ("error", "future", "loop", "remaining")

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.remaining = count
        self.error: str | None = None

    def delivered(self, error: KafkaError | None, _message: Message) -> None:
        # Runs on the delivery-report thread: count there, cross to the loop once.
        if error is not None and self.error is None:
            self.error = str(error)
            self._cross()
            return
        self.remaining -= 1
        if self.remaining == 0 and self.error is None:
            self._cross()

    def _cross(self) -> None:
        # A request abandoned with its event loop closed (a script's asyncio.run ended) must
        # not end the report thread: every later send would wait forever.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        if self.future.done():
            return
        if self.error is not None:
            self.future.set_exception(SubmitUnavailable(f"Kafka did not take it: {self.error}"))
        else:
            self.future.set_result(None)


class SubmitProducer:
    def __init__(
        self,
        kafka: KafkaSettings,
        client_id: str,
        *,
        delivery_timeout_ms: int = DELIVERY_TIMEOUT_MS,
    ) -> None:
        self.topic = kafka.submit_topic
        self._producer = Producer(
            {
                "bootstrap.servers": kafka.bootstrap,
                "client.id": client_id,
                "acks": "all",
                "enable.idempotence": True,
                # No linger: a record goes out as soon as librdkafka's thread sees it, and
                # whatever queued meanwhile (concurrent requests, a REST batch) rides in the
                # same produce request. Any linger is added to every sequential call.
                "linger.ms": 0,
                "message.max.bytes": 16 * 1024 * 1024,
                "message.timeout.ms": delivery_timeout_ms,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
                # After a partition's leader dies, librdkafka refreshes the metadata at this
                # backoff until the new leader shows (its default grows to 1 s): the new leader
                # is known ~2 s after a kill -9 (the brokers' session timeout), and the first
                # acknowledged write came 1-3 s later at the default, ~1 s at 200 ms
                # (BENCHMARKS.md, *One broker of three killed*).
                "retry.backoff.max.ms": METADATA_RETRY_BACKOFF_MAX_MS,
                "error_cb": _log_error,
                # librdkafka's own log lines (a refused connection each time a broker is
                # down) through this logger, served by `poll`, not written to stderr.
                "logger": log,
            }
        )
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="dispatch-submit-poll", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(POLL_S)

    async def send(self, submissions: Sequence[SubmitRequest]) -> None:
        """Write the submissions; returns once Kafka acknowledged every one of them."""
        if not submissions:
            return
        pending = _Pending(asyncio.get_running_loop(), len(submissions))
        try:
            for submission in submissions:
                self._producer.produce(
                    self.topic,
                    key=submission.id.encode(),
                    value=submit_record_value(submission),
                    on_delivery=pending.delivered,
                )
        except (BufferError, KafkaException) as refused:
            pending.future.cancel()  # the reports of what was queued find it settled
            # The local queue is full (Kafka has been away a while) or the record is refused
            # outright: what was queued before still goes out, and the client's retry with
            # the same ids is answered by the dedup check.
            raise SubmitUnavailable(f"Kafka did not take it: {refused}") from refused
        await pending.future

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued (up to `timeout_s`), then stop the report thread."""
        remaining = self._producer.flush(timeout_s)
        if remaining:
            log.warning("%d submissions were not acknowledged before close", remaining)
        self._closed.set()
        self._poller.join(timeout_s)


def _log_error(error: Any) -> None:
    # librdkafka reports transient states (a broker down, reconnecting) here; the
    # deliveries themselves fail only after DELIVERY_TIMEOUT_MS.
    log.warning("submit producer: %s", error)

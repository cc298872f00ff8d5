"""How far the Delta tables are behind Kafka: plain numbers for the API's `/metrics`.

Lag of a topic = sum over its partitions of (end offset for a read_committed consumer, i.e.
the last stable offset) minus (the next offset the last committed batch recorded in `jobs`).
A partition no batch has covered yet counts from its earliest available offset. Uses
kafka-python and delta-rs only (no Spark, no consumer group: nothing is committed to Kafka).
"""

from __future__ import annotations

import time
from typing import Any

from dispatch.delta import tables as t
from dispatch.delta.progress import BATCH, latest_progress
from dispatch.settings import Settings
from dispatch.warehouse import Warehouse


class LagProbe:
    """Keeps one Kafka connection for repeated measurements (e.g. one per scrape)."""

    def __init__(self, settings: Settings, *, client_id: str = "dispatch-streaming-lag") -> None:
        from kafka import KafkaConsumer

        self.settings = settings
        kafka = settings.kafka
        self.topics = (kafka.submit_topic, kafka.events_topic, kafka.rejected_topic)
        self._consumer: Any = KafkaConsumer(
            bootstrap_servers=kafka.bootstrap,
            client_id=client_id,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )

    def partition_lag(self) -> dict[str, dict[int, int]]:
        """topic -> partition -> records not yet in the tables."""
        from kafka import TopicPartition

        committed = latest_progress(Warehouse.of(self.settings), t.JOBS, BATCH)
        processed = committed.progress.offsets if committed else {}
        partitions = [
            TopicPartition(topic, partition)
            for topic in self.topics
            for partition in sorted(self._consumer.partitions_for_topic(topic) or ())
        ]
        end = self._consumer.end_offsets(partitions)
        start = self._consumer.beginning_offsets(partitions)
        lag: dict[str, dict[int, int]] = {topic: {} for topic in self.topics}
        for partition in partitions:
            done = processed.get(partition.topic, {}).get(partition.partition)
            position = start[partition] if done is None else max(done, start[partition])
            lag[partition.topic][partition.partition] = max(0, end[partition] - position)
        return lag

    def measure(self) -> dict[str, int]:
        """topic -> records not yet in the tables."""
        return {topic: sum(parts.values()) for topic, parts in self.partition_lag().items()}

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> LagProbe:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def streaming_lag(settings: Settings) -> dict[str, int]:
    """topic -> records in Kafka not yet in the Delta tables (one-off; see LagProbe)."""
    with LagProbe(settings) as probe:
        return probe.measure()


def last_batch_age_s(warehouse: Warehouse, now: float | None = None) -> float | None:
    """Seconds since the last batch committed `jobs` (None: no batch yet)."""
    committed = latest_progress(warehouse, t.JOBS, BATCH)
    if committed is None:
        return None
    return (time.time() if now is None else now) - committed.timestamp_ms / 1000.0

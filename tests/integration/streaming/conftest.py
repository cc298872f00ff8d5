"""Helpers for the streaming tests: write a workload to Kafka, run the query, read tables.

`mixed_run` (package scope: computed once for the modules that only read its tables) writes
the mixed workload in two parts, runs the query after each, and keeps a snapshot and the lag
taken along the way.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from dispatch.core.dispatcher import Dispatcher
from dispatch.delta.job_rows import job_state
from dispatch.delta.lag import streaming_lag
from dispatch.delta.snapshot import Snapshot, latest_snapshot
from dispatch.event_records import decode_batch
from dispatch.settings import Settings, with_namespace
from dispatch.stack.broker import Broker, create_topics
from dispatch.streaming.app import StreamOptions, run
from dispatch.streaming.batch import BatchWriter
from dispatch.warehouse import Warehouse
from tests.unit.streaming.workload import CONFIG, GROUP, LogRecord, Workload, mixed_workload

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_numbers = itertools.count(1)

FAST = StreamOptions(max_offsets_per_trigger=200, rollup_every_s=0, maintenance=None)
"""Batches of at most 200 records, no maintenance (tests call it themselves)."""


def namespaced(stack_settings: Settings, base: Path, name: str) -> Settings:
    """Settings with topics and folders of their own (as the `settings` fixture makes)."""
    namespace = f"s{next(_numbers)}-{re.sub(r'[^A-Za-z0-9]+', '-', name)}"
    return with_namespace(stack_settings, namespace, base)


def with_warehouse(settings: Settings, base: Path) -> Settings:
    """The same topics, another warehouse and var folder (a second, independent run)."""
    paths = settings.paths.model_copy(
        update={"var": base / "var", "warehouse": str(base / "delta")}
    )
    return settings.model_copy(update={"paths": paths})


def produce(
    settings: Settings,
    records: Sequence[LogRecord],
    *,
    submits: Sequence[tuple[bytes, bytes]] = (),
    rejections: Sequence[bytes] = (),
    aborted: Sequence[LogRecord] = (),
    transactional: bool = False,
) -> None:
    """Write records as the leader does (events keyed by group), optionally in transactions,
    and `aborted` in a transaction that is aborted."""
    kafka = settings.kafka
    plain = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all", linger_ms=0)
    try:
        for key, value in submits:
            plain.send(kafka.submit_topic, key=key, value=value)
        for value in rejections:
            plain.send(kafka.rejected_topic, value=value)
        if not transactional:
            for record in records:
                plain.send(kafka.events_topic, key=GROUP.encode(), value=record.value())
        plain.flush()
    finally:
        plain.close()
    if not transactional and not aborted:
        return
    producer = KafkaProducer(
        bootstrap_servers=kafka.bootstrap,
        transactional_id=f"test-{kafka.events_topic}",
        acks="all",
    )
    try:
        producer.init_transactions()
        if transactional:
            for start in range(0, len(records), 3):
                producer.begin_transaction()
                for record in records[start : start + 3]:
                    producer.send(kafka.events_topic, key=GROUP.encode(), value=record.value())
                producer.commit_transaction()
        for record in aborted:
            producer.begin_transaction()
            producer.send(kafka.events_topic, key=GROUP.encode(), value=record.value())
            producer.flush()
            producer.abort_transaction()
    finally:
        producer.close()


def produce_workload(settings: Settings, workload: Workload) -> None:
    """All of `workload` as the leader and its clients write it: the events in transactions,
    the submissions, the rejections and the aborted transaction."""
    produce(
        settings,
        workload.log,
        submits=workload.submits,
        rejections=workload.rejections,
        aborted=workload.aborted,
        transactional=True,
    )


def run_stream(
    settings: Settings, spark: SparkSession, options: StreamOptions = FAST
) -> BatchWriter:
    writer = run(settings, spark=spark, options=options, available_now=True)
    assert writer is not None  # only a stop asked before the start gives none
    return writer


# --- reading the tables ------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Comparable values: maps as sorted pairs, NaN-free floats kept as they are."""
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    if isinstance(value, list):
        return tuple(_plain(item) for item in value)
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        # delta-rs gives aware UTC times, Spark naive ones in the session time zone (UTC).
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def spark_rows(spark: SparkSession, settings: Settings, name: str) -> list[dict[str, Any]]:
    frame = spark.read.format("delta").load(Warehouse.of(settings).table(name))
    return [{key: _plain(value) for key, value in row.asDict().items()} for row in frame.collect()]


def delta_rs_rows(settings: Settings, name: str) -> list[dict[str, Any]]:
    table = Warehouse.of(settings).open(name).to_pyarrow_table()
    return [{key: _plain(value) for key, value in row.items()} for row in table.to_pylist()]


def row_set(rows: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples of their values (columns in name order), without `drop`."""
    return sorted(
        (tuple((key, row[key]) for key in sorted(row) if key not in drop) for row in rows),
        key=repr,
    )


def jobs_of(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """jobs rows as the core's `JobRecord.to_dict()`, by id."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        _, state = job_state(row)
        assert state.record.id not in out, f"job {state.record.id} appears twice"
        out[state.record.id] = state.record.to_dict()
    return out


def replay_after(settings: Settings, snapshot: Snapshot) -> Dispatcher:
    """What a new leader does: restore the snapshot, replay the log after its offsets."""
    core = Dispatcher.restore(
        snapshot.jobs,
        config=CONFIG,
        epoch=snapshot.fence_epoch,
        pauses=snapshot.pauses,
        limits=snapshot.limits,
    )
    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    try:
        topic = settings.kafka.events_topic
        partitions = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        consumer.assign(partitions)
        for partition in partitions:
            consumer.seek(partition, snapshot.offsets.get(partition.partition, 0))
        end = consumer.end_offsets(partitions)
        while any(consumer.position(p) < end[p] for p in partitions):
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    batch = decode_batch(record.value)
                    if batch.group == snapshot.group:
                        core.apply_all(batch.events)
    finally:
        consumer.close()
    return core


# --- the package's shared run --------------------------------------------------------------------


@dataclass
class MixedRun:
    settings: Settings
    workload: Workload
    writers: list[BatchWriter]
    lag_before: dict[str, int]
    lag_between: dict[str, int]
    lag_after: dict[str, int]
    first_snapshot: Snapshot
    committed_records: int
    """Records of the events topic that read_committed delivers."""
    last_batch_window: tuple[float, float]
    """Wall-clock times (s) before and after the run whose batch committed last."""
    extra: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="package")
def mixed_run(
    kafka_broker: Broker,
    stack_settings: Settings,
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[MixedRun]:
    """The mixed workload (with a prune), written in two parts: the first plainly, the second
    in transactions plus an aborted one; the query runs after each part."""
    settings = namespaced(stack_settings, tmp_path_factory.mktemp("mixed"), "mixed")
    create_topics(settings.kafka)
    workload = mixed_workload(prune=True)
    half = len(workload.log) // 2
    produce(
        settings,
        workload.log[:half],
        submits=workload.submits,
        rejections=workload.rejections,
    )
    lag_before = streaming_lag(settings)
    first = run_stream(settings, spark)
    snapshot = latest_snapshot(Warehouse.of(settings), GROUP)
    assert snapshot is not None
    produce(settings, workload.log[half:], aborted=workload.aborted, transactional=True)
    lag_between = streaming_lag(settings)
    second_started = time.time()
    second = run_stream(settings, spark)
    second_ended = time.time()
    yield MixedRun(
        settings=settings,
        workload=workload,
        writers=[first, second],
        lag_before=lag_before,
        lag_between=lag_between,
        lag_after=streaming_lag(settings),
        first_snapshot=snapshot,
        committed_records=len(workload.log),
        last_batch_window=(second_started, second_ended),
    )


def dump(rows: list[dict[str, Any]]) -> str:
    """For assertion messages."""
    return json.dumps(rows, default=str, indent=1)[:4000]

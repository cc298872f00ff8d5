"""The Structured Streaming application: Kafka (three topics) -> Delta, exactly once.

Run it alone with `python -m dispatch.streaming.app` (settings from conf/ and the environment, see
`dispatch.settings.to_environment`), or from the CLI with `dispatch.streaming.app.main(settings)`.
`run(settings, ...)` is the same without signal handling, for callers that own the process
(and tests, which pass their own Spark session and `available_now=True`).

The query reads `dispatch.submit`, `dispatch.events` and `dispatch.submit.rejected` with
`kafka.isolation.level=read_committed` and hands each micro-batch to `BatchWriter`. Its
checkpoint lives in `<paths.checkpoints>/streaming` (by default `<var>/checkpoints`; a path or
an object-store URI, like the warehouse). A fresh checkpoint over existing tables
starts from the Kafka positions recorded in `jobs` (not from the beginning of the log).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING

from dispatch.delta import tables as t
from dispatch.delta.progress import latest_progress
from dispatch.settings import Settings
from dispatch.storage import Location, is_object_store, local_path
from dispatch.streaming.batch import DRIVER, EXECUTORS, BatchWriter
from dispatch.streaming.decode import Topics
from dispatch.streaming.maintenance import Maintenance, MaintenancePolicy
from dispatch.streaming.rollup import StatsRollup
from dispatch.streaming.session import configure_object_storage, is_local
from dispatch.warehouse import Warehouse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

QUERY_NAME = "dispatch-streaming"
AUTO = "auto"


@dataclass(frozen=True, slots=True)
class StreamOptions:
    trigger_interval_s: float = 0.5
    """How often a new micro-batch may start (it starts only when there is new data)."""
    max_offsets_per_trigger: int | None = 100_000
    """Most Kafka records per micro-batch (all topics together); None: no limit."""
    rollup_every_s: float = 120.0
    """How often the batches' partial statistics are rolled up into `stats` (0: every batch;
    also when the application stops). A roll-up adds a MERGE to the batch that runs it."""
    maintenance: MaintenancePolicy | None = field(default_factory=MaintenancePolicy)
    """Compaction and vacuum schedule; None disables maintenance."""
    checkpoint_name: str = "streaming"
    """Folder under `paths.checkpoints` (`PathSettings.checkpoint_root`)."""
    fold_on: str = AUTO
    """Where each batch is folded: `executors` (partitioned by job, so the fold grows with the
    cluster), `driver` (collected and folded in the driver's Python), or `auto`: the driver on
    a `local[N]` master, the executors on a cluster (docs/streaming.md, *Where the fold
    runs*: on a 2-core machine the driver's fold keeps up where the executors' does not)."""


def fold_place(fold_on: str, master: str) -> str:
    """`fold_on` with `auto` resolved for the Spark master."""
    if fold_on != AUTO:
        return fold_on
    return DRIVER if is_local(master) else EXECUTORS


def topics_of(settings: Settings) -> Topics:
    kafka = settings.kafka
    return Topics(kafka.submit_topic, kafka.events_topic, kafka.rejected_topic)


def checkpoint_dir(settings: Settings, options: StreamOptions | None = None) -> Location:
    """The query's checkpoint: a folder of plain files Spark writes and the fold reads."""
    name = (options or StreamOptions()).checkpoint_name
    return Location.at(settings.paths.checkpoint_root(), settings.storage).child(name)


def starting_offsets(settings: Settings) -> str:
    """Where a query without a checkpoint starts: "earliest" over empty tables, else the
    positions recorded by the last batch in `jobs` (every partition of the three topics)."""
    committed = latest_progress(Warehouse.of(settings), t.JOBS)
    if committed is None:
        return "earliest"
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, group_id=None)
    try:
        document: dict[str, dict[str, int]] = {}
        for topic in topics_of(settings).all():
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                raise RuntimeError(f"topic {topic!r} does not exist: run `dispatch up`")
            known = committed.progress.offsets.get(topic, {})
            # -2 is "earliest" for a partition no batch has read yet.
            document[topic] = {str(p): known.get(p, -2) for p in sorted(partitions)}
    finally:
        consumer.close()
    return json.dumps(document)


def start(
    settings: Settings,
    spark: SparkSession,
    *,
    options: StreamOptions | None = None,
    available_now: bool = False,
) -> tuple[StreamingQuery, BatchWriter]:
    """Create the tables if needed and start the query (non-blocking)."""
    options = options or StreamOptions()
    warehouse = Warehouse.of(settings)
    checkpoint = checkpoint_dir(settings, options)
    # A session built before these settings (a notebook's, the tests' shared one) learns
    # the object store here; one built by spark_session has it already.
    configure_object_storage(spark, settings)
    t.create_tables(spark, warehouse)
    maintenance = (
        Maintenance(warehouse, options.maintenance) if options.maintenance is not None else None
    )
    rollup = StatsRollup(warehouse, options.rollup_every_s)
    writer = BatchWriter(
        warehouse,
        topics_of(settings),
        checkpoint,
        maintenance,
        rollup,
        fold_on=fold_place(options.fold_on, settings.spark.master),
        # Only `auto` sends small batches to the driver: an explicit `executors` means all.
        executor_min_records=(
            settings.spark.executor_fold_min_records if options.fold_on == AUTO else 0
        ),
    )
    fresh = not checkpoint.child("offsets").has_files()
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka.bootstrap)
        .option("subscribe", ",".join(topics_of(settings).all()))
        .option("kafka.isolation.level", "read_committed")
        .option("startingOffsets", starting_offsets(settings) if fresh else "earliest")
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "false")
    )
    if options.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(options.max_offsets_per_trigger))
    writer_stream = (
        reader.load()
        .writeStream.queryName(QUERY_NAME)
        .option("checkpointLocation", checkpoint.uri)
        .foreachBatch(writer)
    )
    if available_now:
        writer_stream = writer_stream.trigger(availableNow=True)
    else:
        writer_stream = writer_stream.trigger(
            processingTime=f"{options.trigger_interval_s} seconds"
        )
    if not is_object_store(checkpoint.uri):
        # On an object store a folder needs no making: it exists through its objects.
        local_path(checkpoint.uri).parent.mkdir(parents=True, exist_ok=True)
    query = writer_stream.start()
    return query, writer


def run(
    settings: Settings,
    *,
    spark: SparkSession | None = None,
    options: StreamOptions | None = None,
    available_now: bool = False,
    stop: threading.Event | None = None,
) -> BatchWriter | None:
    """Run the query until `stop` is set (or, with `available_now`, until everything in the
    topics now is processed). Raises the query's error if it fails. Uses (and leaves running)
    the given Spark session, or builds the project's session and stops it at the end.

    None when `stop` was set before the query started (a SIGTERM while the JVM started):
    the query is not started, rather than started only to wait out its first batch."""
    from dispatch.streaming.session import spark_session

    own_session = spark is None
    session = spark if spark is not None else spark_session(settings, QUERY_NAME)
    if own_session:
        session.sparkContext.setLogLevel("WARN")
    try:
        if stop is not None and stop.is_set():
            log.info("asked to stop before the query started: not starting it")
            return None
        query, writer = start(settings, session, options=options, available_now=available_now)
        try:
            _wait(query, stop)
        finally:
            if query.isActive:
                _stop_gracefully(query)
        error = query.exception()
        if error is not None:
            raise RuntimeError(f"the streaming query failed: {error}")
        if writer.rollup is not None and writer.has_app_id:
            # What the last batches added becomes visible in `stats` before leaving.
            writer.rollup.run(writer.app_id)
        return writer
    finally:
        if own_session:
            session.stop()


def _wait(query: StreamingQuery, stop: threading.Event | None) -> None:
    while query.isActive:
        if stop is not None and stop.is_set():
            return
        query.awaitTermination(1)


def _stop_gracefully(query: StreamingQuery, timeout_s: float = 60.0) -> None:
    """Let a running micro-batch finish before stopping (a cut batch is safe, but redone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and query.isActive and query.status["isTriggerActive"]:
        time.sleep(0.1)
    query.stop()


def parse_options(argv: Sequence[str] | None = None) -> tuple[StreamOptions, bool]:
    """Command-line options of `python -m dispatch.streaming.app` (all optional)."""
    parser = argparse.ArgumentParser(
        prog="python -m dispatch.streaming.app",
        description="Fold the dispatch Kafka log into Delta.",
    )
    defaults = StreamOptions()
    parser.add_argument("--trigger-interval-s", type=float, default=defaults.trigger_interval_s)
    parser.add_argument(
        "--max-offsets-per-trigger", type=int, default=defaults.max_offsets_per_trigger
    )
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="process what the topics hold now, then exit",
    )
    parser.add_argument("--rollup-every-s", type=float, default=defaults.rollup_every_s)
    parser.add_argument("--no-maintenance", action="store_true", help="never OPTIMIZE/VACUUM")
    parser.add_argument(
        "--fold-on",
        choices=[AUTO, EXECUTORS, DRIVER],
        default=defaults.fold_on,
        help="where each batch is folded (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    options = StreamOptions(
        trigger_interval_s=args.trigger_interval_s,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        rollup_every_s=args.rollup_every_s,
        maintenance=None if args.no_maintenance else defaults.maintenance,
        fold_on=args.fold_on,
    )
    return options, bool(args.available_now)


def main(settings: Settings | None = None, argv: Sequence[str] | None = None) -> int:
    """Run the streaming application until SIGINT/SIGTERM; returns the exit code.

    `argv` defaults to none (the defaults of `StreamOptions`); `python -m dispatch.streaming.app`
    passes its command line."""
    from dispatch.settings import ConfigError, load_settings

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options, available_now = parse_options(argv or [])
    if settings is None:
        try:
            settings = load_settings()
        except ConfigError as error:
            print(error, file=sys.stderr)
            return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("%s: stopping after the current batch", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        run(settings, options=options, available_now=available_now, stop=stop)
    except Exception:
        log.exception("the streaming application stopped")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(argv=sys.argv[1:]))

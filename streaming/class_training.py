"""Make the JVMs' class-data-sharing archives (dispatch.stack.class_sharing) by running them.

    .venv/bin/python -m dispatch.streaming.class_training [--force]

Bootstrap runs it. Each archive holds the classes one JVM loaded during a short run of what the
project does with it, written by the JVM as it exits cleanly:

- the broker (`kafka-broker`): topics created, a transaction committed, a consumer group that
  commits offsets, and everything a Spark driver's Kafka source asks of it;
- the Spark driver (`spark-driver`): Delta tables written, merged and read by Spark, and the
  streaming application folding a few records (valid and hostile) on the driver and on the
  executors.

A role whose archive exists for the current jars is skipped, so a warm bootstrap costs
nothing. It lives here, not in `dispatch.stack`, because the driver's run needs the streaming
application (the floor imports nothing above it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from dispatch.settings import Settings, load_settings
from dispatch.stack import class_sharing
from dispatch.stack.broker import Broker, create_topics
from dispatch.stack.class_sharing import ClassSharingError
from dispatch.stack.jars import jar_paths
from dispatch.stack.ports import free_port

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JVM_EXIT_TIMEOUT_S = 120.0
"""A JVM writes its archive (50-200 MB) as it exits: seconds, more on a loaded machine."""


def training_settings(settings: Settings, scratch: Path) -> Settings:
    """A throwaway stack in `scratch` on free ports, on the same jar cache, that reads no
    archive (a JVM cannot read one and write one at once) and compiles as `settings` says."""
    var = scratch / "var"
    return load_settings(
        paths={
            "var": str(var),
            "warehouse": str(var / "delta"),
            "cache": str(settings.paths.cache),
        },
        kafka={"bootstrap": f"127.0.0.1:{free_port()}", "controller_port": free_port()},
        jvm={"class_sharing": False, "quick_start": settings.jvm.quick_start},
    )


def broker_workload(settings: Settings) -> None:
    """A transaction, and a consumer group committing its offsets."""
    from kafka import KafkaConsumer, KafkaProducer

    kafka = settings.kafka
    producer = KafkaProducer(
        bootstrap_servers=kafka.bootstrap, transactional_id="class-training", acks="all"
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for number in range(20):
            producer.send(kafka.events_topic, json.dumps({"n": number}).encode())
        producer.commit_transaction()
    finally:
        producer.close()
    consumer = KafkaConsumer(
        kafka.events_topic,
        bootstrap_servers=kafka.bootstrap,
        group_id="class-training",
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    try:
        consumer.poll(timeout_ms=5000)
        consumer.commit()
    finally:
        consumer.close()


def _submit_records(settings: Settings) -> None:
    """A few submissions for the fold: jobs, and records it must reject."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all")
    try:
        for number in range(20):
            job = {"id": f"training-{number}", "exec": "class.training", "payload": {}}
            producer.send(settings.kafka.submit_topic, json.dumps(job).encode())
        producer.send(settings.kafka.submit_topic, b"\xff not json")
        producer.send(settings.kafka.submit_topic, b'{"id": 7}')
    finally:
        producer.flush()
        producer.close()


def delta_workload(spark: SparkSession, table: Path) -> None:
    """A Delta table written, merged and read by Spark."""
    spark.range(1000).selectExpr("id", "id % 7 AS kind").write.format("delta").save(str(table))
    spark.sql(
        f"MERGE INTO delta.`{table}` t USING (SELECT id, 1 AS kind FROM range(500)) s "
        "ON t.id = s.id WHEN MATCHED THEN UPDATE SET kind = s.kind WHEN NOT MATCHED THEN INSERT *"
    )
    spark.read.format("delta").load(str(table)).groupBy("kind").count().collect()


def _spark_workload(spark: SparkSession, settings: Settings, scratch: Path) -> None:
    """Runs in the driver's Python: Spark's Delta writes, and the fold in both places."""
    from dispatch.streaming.app import StreamOptions, run
    from dispatch.streaming.batch import DRIVER, EXECUTORS

    delta_workload(spark, scratch / "spark-delta")
    for place in (DRIVER, EXECUTORS):
        options = StreamOptions(
            max_offsets_per_trigger=None, rollup_every_s=0, checkpoint_name=f"training-{place}",
            fold_on=place,
        )  # fmt: skip
        run(settings, spark=spark, options=options, available_now=True)


def _train_spark_driver(settings: Settings, scratch: Path, archive: Path) -> None:
    from pyspark import SparkContext

    from dispatch.streaming.session import spark_session

    with class_sharing.dumping(archive) as partial:
        spark = spark_session(
            settings, "dispatch-class-training", class_sharing.dump_options(partial)
        )
        try:
            _spark_workload(spark, settings, scratch)
        finally:
            spark.stop()
            # pyspark's JVM, this process's child, exits when its stdin closes (normally:
            # when this process exits) and writes the archive on the way out; wait for it
            # even when the run failed, so that it does not write after `dumping` cleaned up.
            jvm = SparkContext._gateway.proc if SparkContext._gateway is not None else None
            if jvm is not None:
                if jvm.stdin is not None:
                    jvm.stdin.close()
                try:
                    jvm.wait(JVM_EXIT_TIMEOUT_S)
                except subprocess.TimeoutExpired as slow:
                    jvm.kill()
                    raise ClassSharingError(
                        f"the Spark driver did not exit in {JVM_EXIT_TIMEOUT_S:.0f} s"
                    ) from slow


def train(settings: Settings, *, scratch: Path, force: bool = False) -> list[Path]:
    """Make the archives that are missing (all with `force`); returns those made."""
    broker_archive = class_sharing.archive_path(
        settings, class_sharing.BROKER, jar_paths("broker", settings.jar_cache)
    )
    driver_archive = class_sharing.archive_path(
        settings, class_sharing.SPARK_DRIVER, class_sharing.spark_driver_classpath()
    )
    train_broker = force or not broker_archive.is_file()
    train_driver = force or not driver_archive.is_file()
    if not (train_broker or train_driver):
        return []
    plain = training_settings(settings, scratch)
    made: list[Path] = []
    archiving = class_sharing.dumping(broker_archive) if train_broker else nullcontext(None)
    with archiving as partial:
        broker = Broker(plain, java_options=class_sharing.dump_options(partial) if partial else [])
        broker.start()
        try:
            create_topics(plain.kafka)
            broker_workload(plain)
            if train_driver:
                _submit_records(plain)
                _train_spark_driver(plain, scratch, driver_archive)
                made.append(driver_archive)
        finally:
            broker.stop()
    if train_broker:
        made.append(broker_archive)
    return made


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch.streaming.class_training",
        description="Make the JVM class-data-sharing archives that are missing.",
    )
    parser.add_argument("--force", action="store_true", help="remake them even if present")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dispatch-class-training-") as scratch:
        try:
            made = train(load_settings(), scratch=Path(scratch), force=args.force)
        except Exception as error:  # noqa: BLE001 - any failure only costs start-up speed
            # Every JVM still starts without an archive; say so and let bootstrap go on.
            print(f"class-data sharing: no archive made: {error!r}", file=sys.stderr)
            return 1
    for path in made:
        print(f"class-data sharing: made {path}")
    if made:
        print(f"class-data sharing: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

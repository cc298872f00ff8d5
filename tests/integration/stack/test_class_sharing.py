"""The session's real JVMs start on the class-data-sharing archives bootstrap made
(`dispatch.streaming.class_training`): each maps its archive, made for the jars it runs on. A
JVM that cannot use its archive (jars changed since, a bad file) starts without it, silently slower:
this is where that shows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from dispatch.settings import Settings
from dispatch.stack import class_sharing
from dispatch.stack.broker import Broker
from dispatch.stack.jars import jar_paths

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def mapped_files(pid: int) -> set[Path]:
    """The files a process has mapped into its memory (/proc/PID/maps)."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {Path(line.split(maxsplit=5)[5]) for line in lines if len(line.split()) == 6}


def test_the_broker_maps_the_archive_made_for_its_jars(
    kafka_broker: Broker, stack_settings: Settings
) -> None:
    record = kafka_broker.running()
    assert record is not None
    archive = class_sharing.archive_path(
        stack_settings, class_sharing.BROKER, jar_paths("broker", stack_settings.jar_cache)
    )
    assert archive.is_file(), (
        "no archive for these jars: run python -m dispatch.streaming.class_training"
    )
    assert archive in mapped_files(record.pid)


def test_the_spark_driver_maps_the_archive_made_for_its_jars(
    spark: SparkSession, stack_settings: Settings
) -> None:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    archive = class_sharing.archive_path(
        stack_settings, class_sharing.SPARK_DRIVER, class_sharing.spark_driver_classpath()
    )
    assert archive.is_file(), (
        "no archive for these jars: run python -m dispatch.streaming.class_training"
    )
    assert archive in mapped_files(pid)
    # The suite runs its JVMs on the client compiler (tests/conftest.py), the drivers it
    # spawns too, except this session's own driver: it folds for the whole run, and Spark's
    # planning there needs C2's code.
    conf = spark.sparkContext.getConf()
    driver = conf.get("spark.driver.extraJavaOptions") or ""
    assert class_sharing.QUICK_START_OPTION not in driver.split()
    executors = conf.get("spark.executor.extraJavaOptions") or ""
    assert class_sharing.QUICK_START_OPTION in executors.split()

"""The one way to build a Spark session: Delta and the Kafka connector from the local jar cache.

Jars come from `spark.jars` (verified by dispatch.stack.jars), never from Ivy at run time, so a
session starts offline and always with the pinned versions. Sized for a 2-core machine.

The same code runs on `local[N]` and on a standalone cluster (`spark.master = spark://...`):
everything that differs is a setting (`SparkSettings`), see docs/streaming.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from dispatch.settings import Settings
from dispatch.stack.jars import jar_paths


def is_local(master: str) -> bool:
    """True for masters that run the executors inside the driver's JVM: `local`, `local[N]`,
    `local[N,F]` (not `local-cluster[...]`, which starts executor JVMs of its own)."""
    return master == "local" or master.startswith("local[")


def spark_config(
    settings: Settings, jars: Sequence[Path], python: str = sys.executable
) -> dict[str, str]:
    """Every configuration pair of the session (pure: the unit tests check it without a JVM).

    `python` is the interpreter executors start Python workers with on a cluster."""
    spark = settings.spark
    var = settings.paths.var
    utc = "-Duser.timezone=UTC"
    partitions = str(spark.shuffle_partitions)
    config = {
        "spark.master": spark.master,
        # Local paths: the driver serves them to executors over its file server, so a worker
        # needs no jar cache of its own.
        "spark.jars": ",".join(str(path) for path in jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.driver.memory": spark.driver_memory,
        "spark.driver.host": spark.driver_host,
        "spark.driver.bindAddress": spark.driver_bind_address,
        "spark.executor.extraJavaOptions": utc,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": str(spark.ui_enabled).lower(),
        "spark.ui.port": str(spark.ui_port),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": partitions,
        "spark.default.parallelism": partitions,
        "spark.databricks.delta.snapshotPartitions": partitions,
        "spark.sql.warehouse.dir": str(var / "spark-warehouse"),
        # -Xss: a batch's rows reach Spark as a local relation inside the plan, and a large
        # batch's plan string overflowed the default 1 MB thread stack in a regex (seen at
        # 40k records per batch in bench/streaming_bench.py).
        "spark.driver.extraJavaOptions": f"{utc} -Xss16m -Dderby.system.home={var / 'derby'}",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    }
    if not is_local(spark.master):
        # Separate executor JVMs: their heap must fit a worker's memory (Spark's default is
        # 1g), and their Python workers must run this project's interpreter (the venv), not
        # the `python3` first on a worker's PATH.
        config["spark.executor.memory"] = spark.executor_memory
        config["spark.pyspark.python"] = python
    return config


def spark_session(settings: Settings, app_name: str = "dispatch") -> SparkSession:
    """Get or create the process's Spark session, configured for Delta and Kafka."""
    # The Python workers must run the driver's interpreter (the venv), not whatever `python3`
    # is first on PATH: pyspark reads PYSPARK_PYTHON (not the conf) for the functions it ships.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    jars = jar_paths("spark", settings.jar_cache)
    builder = SparkSession.builder.appName(app_name)
    for key, value in spark_config(settings, jars).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()

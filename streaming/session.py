"""The one way to build a Spark session: Delta and the Kafka connector from the local jar cache.

Jars come from `spark.jars` (verified by dispatch.stack.jars), never from Ivy at run time, so a
session starts offline and always with the pinned versions. Sized for a 2-core machine.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from dispatch.settings import Settings
from dispatch.stack.jars import jar_paths


def spark_session(settings: Settings, app_name: str = "dispatch") -> SparkSession:
    """Get or create the process's Spark session, configured for Delta and Kafka."""
    # The Python workers must run the driver's interpreter (the venv), not whatever `python3`
    # is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    var = settings.paths.var
    jars = ",".join(str(path) for path in jar_paths("spark", settings.jar_cache))
    utc = "-Duser.timezone=UTC"
    builder = (
        SparkSession.builder.master(settings.spark.master)
        .appName(app_name)
        .config("spark.jars", jars)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.driver.memory", settings.spark.driver_memory)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.extraJavaOptions", utc)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", str(settings.spark.ui_enabled).lower())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(settings.spark.shuffle_partitions))
        .config("spark.default.parallelism", str(settings.spark.shuffle_partitions))
        .config("spark.databricks.delta.snapshotPartitions", str(settings.spark.shuffle_partitions))
        .config("spark.sql.warehouse.dir", str(var / "spark-warehouse"))
        # -Xss: a batch's rows reach Spark as a local relation inside the plan, and a large
        # batch's plan string overflowed the default 1 MB thread stack in a regex (seen at
        # 40k records per batch in bench/streaming_bench.py).
        .config(
            "spark.driver.extraJavaOptions",
            f"{utc} -Xss16m -Dderby.system.home={var / 'derby'}",
        )
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    return builder.getOrCreate()

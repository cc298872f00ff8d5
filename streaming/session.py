"""The one way to build a Spark session: Delta and the Kafka connector from the local jar cache.

Jars come from `spark.jars` (verified by dispatch.stack.jars), never from Ivy at run time, so a
session starts offline and always with the pinned versions. Sized for a 2-core machine.

The same code runs on `local[N]` and on a standalone cluster (`spark.master = spark://...`):
everything that differs is a setting (`SparkSettings`), see docs/streaming.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from dispatch.settings import Settings, StorageSettings
from dispatch.stack import class_sharing
from dispatch.stack.jars import JarError, jar_paths
from dispatch.storage import S3_SCHEMES, scheme, storage_options

S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
SIMPLE_CREDENTIALS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
TEMPORARY_CREDENTIALS = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
S3A_MINIMUM_TIMEOUT_S = 15.0
"""hadoop-aws 3.5.0 raises every network timeout below this to it
(`Constants.MINIMUM_NETWORK_OPERATION_DURATION`); the config says so rather than asking for
less and silently getting 15 s."""
_ANY_S3_LOCATION = "s3://bucket"
"""delta-rs' options are the same for every S3 location: any one resolves them."""


def is_local(master: str) -> bool:
    """True for masters that run the executors inside the driver's JVM: `local`, `local[N]`,
    `local[N,F]` (not `local-cluster[...]`, which starts executor JVMs of its own)."""
    return master == "local" or master.startswith("local[")


def uses_s3(settings: Settings) -> bool:
    """Whether the warehouse or the checkpoints are on S3 (`s3://` or `s3a://`)."""
    locations = (settings.paths.warehouse, settings.paths.checkpoint_root())
    return any(scheme(location) in S3_SCHEMES for location in locations)


def _milliseconds(seconds: float) -> str:
    # Hadoop's getTimeDuration takes a whole number with a unit suffix, no fractions.
    return f"{round(max(seconds, S3A_MINIMUM_TIMEOUT_S) * 1000)}ms"


def s3a_config(
    storage: StorageSettings, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Hadoop configuration (keys without `spark.hadoop.`) for S3A to reach what `storage`
    names, with `s3://` URIs served by S3A too (delta-rs and the rest of the project write
    `s3://`; Hadoop has no `s3` filesystem of its own).

    Endpoint, region and credentials are resolved exactly as for delta-rs (`storage_options`:
    the settings, else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION /
    AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, and
    the same refusal of plain HTTP beyond loopback), so Spark and delta-rs always reach the
    same store as the same identity. Without keys, S3A keeps its default provider chain
    (environment, then instance / container credentials).

    The secret and the token land in keys that Spark's default `spark.redaction.regex`
    (`(?i)secret|password|token|access[.]?key` in 4.2.0) matches (`fs.s3a.secret.key`,
    `fs.s3a.session.token`, `fs.s3a.access.key`), so the UI's environment page and the
    event log show them redacted, whether set as `spark.hadoop.*` or on the running
    session's Hadoop configuration (`configure_object_storage`)."""
    options = storage_options(storage, _ANY_S3_LOCATION, environ)
    config = {
        # FileSystem only: S3A's FileContext binding (`org.apache.hadoop.fs.s3a.S3A`) accepts
        # `s3a` alone and would fail on `s3://`. Without one, Spark's streaming checkpoint
        # logs that it falls back on the FileSystem API ("rename may not be atomic"), which
        # is harmless here: on S3A both APIs rename by copy-then-delete, and a copy publishes
        # the whole object at once.
        "fs.s3.impl": S3A_FILESYSTEM,
        # The AWS SDK >= 2.30 adds CRC32 "flexible checksums" to every request and drops
        # Content-MD5 (which DeleteObjects, S3A's bulk delete, must carry one or the other),
        # a combination many S3-compatible servers reject or mishandle. hadoop-aws 3.5.0
        # builds its clients with checksums only WHEN_REQUIRED and the SDK's LegacyMd5Plugin
        # (DefaultS3ClientFactory), unless these say otherwise: its defaults, pinned so an
        # upgrade cannot flip them silently. (S3Proxy 4.0.0 accepts either way: tried.)
        "fs.s3a.checksum.generation": "false",
        "fs.s3a.checksum.validation": "false",
        "fs.s3a.request.md5.header": "true",
        # Network limits from the same settings as delta-rs'. S3A applies the request
        # timeout to each attempt and to the whole call with its retries, which is what
        # `retry_timeout_s` bounds for delta-rs; data uploads have their own (15 min) limit.
        "fs.s3a.connection.establish.timeout": _milliseconds(storage.connect_timeout_s),
        "fs.s3a.connection.timeout": _milliseconds(storage.request_timeout_s),
        "fs.s3a.connection.request.timeout": _milliseconds(
            max(storage.request_timeout_s, storage.retry_timeout_s)
        ),
        # Retries in the SDK, and S3A's own retries around them: both bounded by the one
        # setting, so a dead store fails the query in seconds, not after S3A's default 7.
        "fs.s3a.attempts.maximum": str(storage.max_retries),
        "fs.s3a.retry.limit": str(storage.max_retries),
    }
    if endpoint := options.get("aws_endpoint"):
        config["fs.s3a.endpoint"] = endpoint
        # S3A takes the scheme from an endpoint URL and reads this flag only for a bare host
        # name; set both so they can never disagree.
        http = endpoint.lower().startswith("http://")
        config["fs.s3a.connection.ssl.enabled"] = "false" if http else "true"
        # `host/bucket/key`: what S3-compatible servers answer (no wildcard DNS for buckets).
        virtual = options["aws_virtual_hosted_style_request"] == "true"
        config["fs.s3a.path.style.access"] = "false" if virtual else "true"
    if region := options.get("aws_region"):
        # SigV4 signs the region; an S3-compatible server ignores it but needs one named.
        config["fs.s3a.endpoint.region"] = region
    if access_key := options.get("aws_access_key_id"):
        config["fs.s3a.access.key"] = access_key
        config["fs.s3a.secret.key"] = options["aws_secret_access_key"]
        if token := options.get("aws_session_token"):
            config["fs.s3a.session.token"] = token
            config["fs.s3a.aws.credentials.provider"] = TEMPORARY_CREDENTIALS
        else:
            # Only these keys: not the environment or an instance role that the default
            # chain would fall through to if the keys were refused.
            config["fs.s3a.aws.credentials.provider"] = SIMPLE_CREDENTIALS
    return config


def session_jars(settings: Settings) -> list[Path]:
    """The session's jars: the `spark` set, and the `s3` set (S3A) when it is in the cache.

    The S3A classes load only when an `s3://` path is first touched, so a session that never
    touches one pays only for shipping the jars (13 MB); including them whenever present lets
    `configure_object_storage` point a running session at S3 later. A session whose settings
    name S3 requires them: better a clear JarError at start than a ClassNotFoundException
    for S3AFileSystem at the first batch."""
    jars = jar_paths("spark", settings.jar_cache)
    try:
        s3_jars = jar_paths("s3", settings.jar_cache)
    except JarError:
        if uses_s3(settings):
            raise
        return jars
    return [*jars, *s3_jars]


def spark_config(
    settings: Settings,
    jars: Sequence[Path],
    python: str = sys.executable,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Every configuration pair of the session (pure: the unit tests check it without a JVM).

    `python` is the interpreter executors start Python workers with on a cluster; `environ`
    (default: os.environ) supplies the AWS variables `s3a_config` falls back on."""
    spark = settings.spark
    var = settings.paths.var
    utc = "-Duser.timezone=UTC"
    driver_jvm = " ".join(
        class_sharing.java_options(
            settings, class_sharing.SPARK_DRIVER, class_sharing.spark_driver_classpath()
        )
    )
    executor_jvm = " ".join([utc, *class_sharing.quick_start_options(settings)])
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
        # The executors' classpath is the worker's, not the driver's: the compiler option
        # only, no archive.
        "spark.executor.extraJavaOptions": executor_jvm,
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
        "spark.driver.extraJavaOptions": (
            f"{utc} -Xss16m -Dderby.system.home={var / 'derby'} {driver_jvm}"
        ).strip(),
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        # Spark keeps 100 compiled classes (generated code, by source) by default: the fold's
        # batches and the Delta commands under them generate more, so they were evicted and
        # generated, compiled and JIT-compiled again (a test file of batches: 602 compilations
        # at 100, 216 at 2,000: BENCHMARKS.md, *JVM start-up*). A class is a few KB.
        "spark.sql.codegen.cache.maxEntries": "1000",
    }
    if not is_local(spark.master):
        # Separate executor JVMs: their heap must fit a worker's memory (Spark's default is
        # 1g), and their Python workers must run this project's interpreter (the venv), not
        # the `python3` first on a worker's PATH.
        config["spark.executor.memory"] = spark.executor_memory
        config["spark.pyspark.python"] = python
    if uses_s3(settings):
        # As `spark.hadoop.*`: copied into the Hadoop configuration of the driver and of every
        # executor at start, so tasks on a cluster reach the store as the driver does.
        for key, value in s3a_config(settings.storage, environ).items():
            config[f"spark.hadoop.{key}"] = value
    return config


def spark_session(
    settings: Settings, app_name: str = "dispatch", driver_java_options: Sequence[str] = ()
) -> SparkSession:
    """Get or create the process's Spark session, configured for Delta and Kafka;
    `driver_java_options` are added to the driver JVM's (dispatch.streaming.class_training's)."""
    # The Python workers must run the driver's interpreter (the venv), not whatever `python3`
    # is first on PATH: pyspark reads PYSPARK_PYTHON (not the conf) for the functions it ships.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    config = spark_config(settings, session_jars(settings))
    if driver_java_options:
        key = "spark.driver.extraJavaOptions"
        config[key] = " ".join([config[key], *driver_java_options])
    builder = SparkSession.builder.appName(app_name)
    for key, value in config.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def configure_object_storage(spark: SparkSession, settings: Settings) -> None:
    """Point a running session at the object store `settings` name (no-op without S3).

    For a session built before the settings named one (`getOrCreate` returns the existing
    session unchanged; the test suite shares one): sets `s3a_config` on the SparkContext's
    Hadoop configuration, which every Hadoop configuration Spark builds afterwards copies:
    the session's (`SessionState.newHadoopConf`, read by Delta's log store and by the
    streaming checkpoint when a query starts) and the one each job ships to its tasks (the
    Parquet files Delta writes). Call it before the first `s3://` path is touched: Hadoop
    caches one S3AFileSystem per scheme and bucket, built from the configuration of the
    moment, and later changes do not reach a cached instance."""
    if not uses_s3(settings):
        return
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    # The class loader Hadoop resolves `fs.s3.impl` with: a session started without the `s3`
    # jar set would otherwise fail later, at the first `s3://` path, far from the cause.
    if hadoop.getClassByNameOrNull(S3A_FILESYSTEM) is None:
        raise JarError(
            f"{S3A_FILESYSTEM} is not on this Spark session's classpath: the session was "
            "started without the s3 jar set (run scripts/bootstrap.sh, then restart it)"
        )
    for key, value in s3a_config(settings.storage).items():
        hadoop.set(key, value)

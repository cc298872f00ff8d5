"""The Delta tables the streaming application maintains: names, schemas, partitioning.

Schemas are written once, as Arrow schemas (the fold builds its rows in Arrow), and converted
for Spark. Every table keeps to the features delta-rs reads and writes: protocol (1, 2), no
deletion vectors, row tracking, clustering, in-commit timestamps or identity columns; partitions
by plain columns only.

- `events`: one row per record of `dispatch.submit` and `dispatch.submit.rejected`, and per
  logged event of `dispatch.events`; partitioned by `date` (UTC day of the event).
- `jobs`: one row per job the leader holds (current state); partitioned by `part`: `open`
  (queued, running, dead) or `closed` (succeeded, cancelled, expired).
- `jobs_archive`: one row per job life the leader pruned; partitioned by `date` (UTC day of
  its last update).
- `stats`: one row per minute x dispatch group x exec x client; partitioned by `date`.
  Rolled up from `stats_partial` every `StreamOptions.rollup_every_s`.
- `stats_partial`: each batch's contributions to `stats` not rolled up yet (small, emptied by
  every roll-up); unpartitioned.
- `rejected`: one row per rejected submission; partitioned by `date`.
- `pauses`: one row per pause in force (an exec pattern's queues or a client's jobs held by
  an operator); unpartitioned, small. Rewritten whole by a batch with `paused`/`resumed`
  events, before its `jobs` commit (see `dispatch.delta.pauses`).
- `limits`: one row per runtime limit in force (an operator's limit on a client, an exec
  pattern or a concurrency key); unpartitioned, small. Rewritten whole by a batch with
  `limit_set`/`limit_removed` events, before its `jobs` commit (see `dispatch.delta.limits`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from dispatch.warehouse import Warehouse

log = logging.getLogger(__name__)

EVENTS = "events"
JOBS = "jobs"
JOBS_ARCHIVE = "jobs_archive"
STATS = "stats"
STATS_PARTIAL = "stats_partial"
REJECTED = "rejected"
PAUSES = "pauses"
LIMITS = "limits"

_TIME = pa.timestamp("us", tz="UTC")

_JOB_FIELDS: list[tuple[str, pa.DataType]] = [
    ("dispatch_group", pa.string()),
    ("id", pa.string()),
    ("client_id", pa.string()),
    ("exec", pa.string()),
    ("status", pa.string()),
    ("attempts", pa.int32()),
    ("worker_id", pa.string()),
    ("submitted_at", pa.float64()),
    ("updated_at", pa.float64()),
    ("result", pa.string()),
    ("error", pa.string()),
    ("payload", pa.string()),
    ("max_attempts", pa.int32()),
    ("timeout_s", pa.float64()),
    ("priority", pa.int32()),
    ("not_before", pa.float64()),
    ("lease", pa.string()),
    ("deadline", pa.float64()),
    ("dead_reason", pa.string()),
    ("seq", pa.int64()),
    ("queued_at", pa.float64()),
    ("started_at", pa.float64()),
]

_LATER_JOB_FIELDS: list[tuple[str, pa.DataType]] = [
    ("retry", pa.string()),
    ("expires_at", pa.float64()),
    ("max_run_s", pa.float64()),
    ("run_limit_at", pa.float64()),
    ("cancel_requested_at", pa.float64()),
    ("progress", pa.string()),
    ("key", pa.string()),
]
"""Columns of `jobs` and `jobs_archive` added after tables were in use (`retry`: the job's
own retry policy as JSON; `expires_at`: when it expires; `max_run_s`: the hard time limit of
each attempt; `run_limit_at`: when the running attempt reaches it; `cancel_requested_at`:
when a cancel of the running job was asked for; `progress`: its worker's latest progress
report as JSON, `{done, total, message, at}`; `key`: its concurrency key). They sit after
the other job columns and before the partition columns, in new tables and, through `ALTER
TABLE ... ADD COLUMNS ... AFTER`, in old ones: delta-rs's MERGE misreports its file counts
(0 files scanned, all skipped, while it rewrites some) when a table's partition column is
not last, and the batch benchmark and tests read those counts."""

_PERCENTILE_SUFFIXES = ("p50_s", "p95_s", "p99_s")


def _latency_fields(percentiles: bool) -> list[tuple[str, pa.DataType]]:
    suffixes: list[tuple[str, pa.DataType]] = [
        ("n", pa.int64()),
        ("sum_s", pa.float64()),
        ("min_s", pa.float64()),
        ("max_s", pa.float64()),
    ]
    if percentiles:
        suffixes += [(suffix, pa.float64()) for suffix in _PERCENTILE_SUFFIXES]
    suffixes.append(("hist", pa.map_(pa.int32(), pa.int64())))
    return [
        (f"{latency}_{suffix}", kind)
        for latency in ("queue_wait", "run_time")
        for suffix, kind in suffixes
    ]


_STATS_KEY_FIELDS: list[tuple[str, pa.DataType]] = [
    ("date", pa.date32()),
    ("minute", _TIME),
    ("dispatch_group", pa.string()),
    ("exec", pa.string()),
    ("client_id", pa.string()),
]
_COUNTER_FIELDS: list[tuple[str, pa.DataType]] = [
    (name, pa.int64())
    for name in (
        "submitted", "started", "retries", "completed", "requeued", "dead", "cancelled", "redriven",
    )
]  # fmt: skip

SCHEMAS: dict[str, pa.Schema] = {
    EVENTS: pa.schema(
        [
            ("date", pa.date32()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("idx", pa.int32()),
            ("kind", pa.string()),
            ("dispatch_group", pa.string()),
            ("record_epoch", pa.int64()),
            ("type", pa.string()),
            ("epoch", pa.int64()),
            ("at", pa.float64()),
            ("event_time", _TIME),
            ("job_id", pa.string()),
            ("worker_id", pa.string()),
            ("admitted", pa.bool_()),
            ("body", pa.string()),
            ("raw", pa.binary()),
            ("error", pa.string()),
            ("kafka_time", _TIME),
            ("batch_id", pa.int64()),
        ]
    ),
    JOBS: pa.schema([*_JOB_FIELDS, *_LATER_JOB_FIELDS, ("part", pa.string())]),
    JOBS_ARCHIVE: pa.schema(
        [
            *_JOB_FIELDS,
            *_LATER_JOB_FIELDS,
            ("archived_at", pa.float64()),
            ("date", pa.date32()),
        ]
    ),
    STATS: pa.schema([*_STATS_KEY_FIELDS, *_COUNTER_FIELDS, *_latency_fields(True)]),
    STATS_PARTIAL: pa.schema(
        [
            *_STATS_KEY_FIELDS,
            *_COUNTER_FIELDS,
            *_latency_fields(False),
            ("batch_end", pa.int64()),
            ("batch_id", pa.int64()),
        ]
    ),
    REJECTED: pa.schema(
        [
            ("date", pa.date32()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("reason", pa.string()),
            ("source_topic", pa.string()),
            ("source_partition", pa.int32()),
            ("source_offset", pa.int64()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("value_text", pa.string()),
            ("job_id", pa.string()),
            ("at", pa.float64()),
            ("rejected_time", _TIME),
            ("kafka_time", _TIME),
            ("batch_id", pa.int64()),
        ]
    ),
    PAUSES: pa.schema(
        [
            ("dispatch_group", pa.string()),
            ("scope", pa.string()),
            ("target", pa.string()),
            ("epoch", pa.int64()),
            ("at", pa.float64()),
            ("by", pa.string()),
            ("reason", pa.string()),
        ]
    ),
    LIMITS: pa.schema(
        [
            ("dispatch_group", pa.string()),
            ("scope", pa.string()),
            ("target", pa.string()),
            ("max_inflight", pa.int64()),
            ("rate", pa.float64()),
            ("burst", pa.int64()),
            ("epoch", pa.int64()),
            ("at", pa.float64()),
            ("by", pa.string()),
            ("reason", pa.string()),
        ]
    ),
}

PARTITIONS: dict[str, list[str]] = {
    EVENTS: ["date"],
    JOBS: ["part"],
    JOBS_ARCHIVE: ["date"],
    STATS: ["date"],
    STATS_PARTIAL: [],
    REJECTED: ["date"],
    PAUSES: [],
    LIMITS: [],
}

KEYS: dict[str, list[str]] = {
    EVENTS: ["topic", "partition", "offset", "idx"],
    JOBS: ["dispatch_group", "id"],
    JOBS_ARCHIVE: ["dispatch_group", "id", "submitted_at"],
    STATS: ["minute", "dispatch_group", "exec", "client_id"],
    STATS_PARTIAL: ["batch_end", "minute", "dispatch_group", "exec", "client_id"],
    REJECTED: ["topic", "partition", "offset"],
    PAUSES: ["dispatch_group", "scope", "target"],
    LIMITS: ["dispatch_group", "scope", "target"],
}
"""What identifies a row (no two rows share it)."""

TABLE_PROPERTIES: dict[str, str] = {
    # MERGE rewrites the few small files of jobs' open partition; deletion vectors would
    # save little there and cost every reader a second lookup.
    "delta.enableDeletionVectors": "false",
    "delta.enableRowTracking": "false",
    "delta.enableInCommitTimestamps": "false",
}

JOBS_FILE_BYTES = 1 << 20
"""The size delta-rs's writers aim at for a file of `jobs` (its `delta.targetFileSize`), about
20,000 rows. A batch's MERGE rewrites every file holding a row it changes, and scans every
file whose `seq` statistics may hold one: with files this size, a backlog of queued jobs
spread over many of them costs a batch the few files it touches, not the whole open partition
(BENCHMARKS.md, *Streaming*, *Batch cost against the backlog*). The MERGE writes its output in
that order: new rows first, then the rewritten files' rows in their order; so the rows it
inserts, which wait in the queue longest, end up in files of their own once a file fills."""

TABLE_PROPERTIES_OF: dict[str, dict[str, str]] = {
    JOBS: {"delta.targetFileSize": str(JOBS_FILE_BYTES)},
}
"""Properties of one table, besides `TABLE_PROPERTIES`."""


def spark_schema(name: str) -> StructType:
    return spark_schema_of(SCHEMAS[name])


def spark_schema_of(schema: pa.Schema) -> StructType:
    """An Arrow schema as Spark's (timestamps with their time zone)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)


def empty_table(name: str) -> pa.Table:
    return SCHEMAS[name].empty_table()


def arrow_rows(name: str, rows: list[dict[str, object]]) -> pa.Table:
    """Rows of `name` as an Arrow table with exactly the table's schema."""
    return pa.Table.from_pylist(rows, schema=SCHEMAS[name])


def _delete_folder(spark: SparkSession, location: str) -> None:
    """Delete a folder through Spark's own Hadoop filesystem: the one that reaches the
    location as Spark's Delta does (pyarrow's S3 bulk delete lacks the Content-MD5 header
    some S3-compatible servers, S3Proxy among them, require)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "a Spark session in this process"
    path = jvm.org.apache.hadoop.fs.Path(location)
    path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(path, True)


def _add_missing_columns(
    spark: SparkSession, warehouse: Warehouse, name: str, table: DeltaTable
) -> bool:
    """Add the columns a newer schema has to a table created before them, each after the
    column it follows in the schema (nullable: old rows read them as NULL, which every reader
    takes for the field's default). Whether it added any."""
    have = {field.name for field in table.schema().fields}
    schema = SCHEMAS[name]
    missing = [i for i, field in enumerate(schema) if field.name not in have]
    if not missing:
        return False
    specs = []
    for i in missing:
        [column] = spark_schema_of(pa.schema([schema.field(i)])).fields
        place = f" AFTER `{schema.field(i - 1).name}`" if i else " FIRST"
        specs.append(f"`{column.name}` {column.dataType.simpleString()}{place}")
    spec = ", ".join(specs)
    log.info("table %s: adding columns %s", name, spec)
    spark.sql(f"ALTER TABLE delta.`{warehouse.table(name)}` ADD COLUMNS ({spec})")
    return True


def create_tables(spark: SparkSession, warehouse: Warehouse) -> None:
    """Create every table that does not exist yet (a no-op for the others).

    Whether a table exists is asked of delta-rs: Spark's `isDeltaTable` loads the table's
    snapshot with Spark jobs, and a fold that restarts over its tables would pay that six
    times before its first batch, then never use Spark's Delta again on the driver's path.
    The tables are created by Spark: delta-rs refuses the `TABLE_PROPERTIES` that pin them to
    the plain protocol."""
    from delta.tables import DeltaTable

    for name in SCHEMAS:
        table = warehouse.open_if_exists(name)
        if table is None:
            abandoned = warehouse.abandoned_log(name)
            if abandoned is not None:
                # The fold is the tables' only creator: nobody else is half-way through
                # creating this one now, so what is there was left by a fold that died.
                log.warning("table %s: removing the log of a creation that never committed", name)
                _delete_folder(spark, abandoned)
            builder = (
                DeltaTable.createIfNotExists(spark)
                .location(warehouse.table(name))
                .addColumns(spark_schema(name))
            )
            if PARTITIONS[name]:
                builder = builder.partitionedBy(*PARTITIONS[name])
            for key, value in TABLE_PROPERTIES.items():
                builder = builder.property(key, value)
            builder.execute()
        elif _add_missing_columns(spark, warehouse, name, table):
            table = None  # changed by Spark: a later step reads it again
        own = TABLE_PROPERTIES_OF.get(name)
        if own:
            # Set by delta-rs, which knows them (Spark's Delta refuses `delta.targetFileSize`
            # as unknown); also on a table created before they existed.
            table = table if table is not None else warehouse.open(name)
            configuration = table.metadata().configuration
            missing = {key: value for key, value in own.items() if configuration.get(key) != value}
            if missing:
                table.alter.set_table_properties(missing)

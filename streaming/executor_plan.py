"""A micro-batch folded on Spark's executors, partitioned by job.

The driver never holds the batch's records or events. It runs Spark jobs over the batch:

1. the events topic's records the tables have not absorbed are exploded into their `events`
   rows on the executors (`partition_fold.explode_records`; kept in memory for the steps
   below);
2. the driver collects the few rows the fence and the prunes depend on (`leader_elected` and
   `pruned` events, and the events records that are not taken whole) and runs the fence over
   them: only an election moves a group's fence, so the fence of every other event is a
   column expression over its group and place;
3. the admitted job events and the touched jobs' open rows (read by Spark from `jobs`, joined
   on the touched keys) are repartitioned by job and folded on the executors
   (`partition_fold.fold_partition`, i.e. `fold_batch`, the one fold function), one Python call
   per partition;
4. what the batch writes stays on the executors where it is large — the jobs' new rows and
   the `events` rows with their fence verdict, cached until written, then written by Spark
   (`spark_writes.py`: the executors write the files, the driver commits once per table) —
   and comes to the driver as Arrow where it is small (the partitions' statistics, archived
   lives, refusals); `BatchWriter.write_planned` commits it all in the order a driver-side
   fold's batch is committed.

The rare parts stay on the driver: a batch's `rejected` rows (rejection records, and events
records with an undecodable value or refused events) are built from those records alone, by
the driver's own code; a batch with prunes also collects its touched keys for the archive step.

Log order is (partition, offset, index in the record), as everywhere in the fold.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from dispatch.core.events import (
    Event,
    LeaderElected,
    LimitRemoved,
    LimitSet,
    Paused,
    Pruned,
    Resumed,
)
from dispatch.core.fence import EpochFence
from dispatch.delta import tables as t
from dispatch.delta.job_rows import OPEN, JobKey
from dispatch.delta.progress import Offsets
from dispatch.streaming.decode import (
    KafkaRow,
    Refused,
    decode_events,
    kafka_rows,
    screen_events,
)
from dispatch.streaming.fold import BatchFold
from dispatch.streaming.open_jobs import cover_ranges
from dispatch.streaming.partition_fold import (
    EVENT_KIND,
    FOLD_INPUT,
    FOLD_OUTPUT,
    JOB_ROW,
    KIND_ARCHIVED,
    KIND_JOB,
    KIND_OPEN_SEQS,
    KIND_REFUSED,
    KIND_STATS,
    SEQ_RANGES,
    PruneEvent,
    explode_other_records,
    explode_records,
    fold_partition,
    logged_event,
    prune_steps,
)
from dispatch.streaming.planned import JOBS_SOURCE, Planned
from dispatch.streaming.rollup import aggregate
from dispatch.streaming.spark_writes import ExecutorRows

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from dispatch.streaming.batch import BatchWriter

_CONTROL_TYPES = (
    LeaderElected.type, Pruned.type, Paused.type, Resumed.type, LimitSet.type, LimitRemoved.type,
)  # fmt: skip
_GROUP_ROW = "group"
"""`kind` of the rows naming the groups a batch's events belong to (not an `events` kind)."""
Place = tuple[int, int, int]
_PLACE_COLUMNS = ("partition", "offset", "idx", "record_epoch", "body")
"""An event's place and what it is: NULL in the rows that stand for something else."""


def _map_in_arrow(frame: DataFrame, function: Any, schema: pa.Schema) -> DataFrame:
    """`frame.mapInArrow(function, schema)`, without pyspark's pandas-version warning: pyspark
    4.2 builds the Arrow UDF through `pandas_udf`, which warns that pandas 3 is not fully
    supported, though no pandas is involved in an Arrow map."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
        )
        return frame.mapInArrow(function, t.spark_schema_of(schema))


FOLD_JOB = "dispatch fold"
"""The Spark job description of a batch's fold (`<FOLD_JOB>, batch <id>`), as the UI and its
REST API show it (tests/integration/streaming/test_cluster.py finds the fold's tasks by it)."""


@contextlib.contextmanager
def _described(spark: Any, description: str) -> Iterator[None]:
    """Name the Spark jobs started inside (in the UI, the event log and the REST API)."""
    context = spark.sparkContext
    context.setJobDescription(description)
    try:
        yield
    finally:
        context.setLocalProperty("spark.job.description", None)


def _unseen(marks: Mapping[int, int]) -> Column:
    """Records at or after a table's position (partition -> next offset) in their partition."""
    from pyspark.sql import functions as F

    known = list(marks)
    condition = ~F.col("partition").isin(known) if known else F.lit(True)
    for partition, offset in marks.items():
        condition = condition | ((F.col("partition") == partition) & (F.col("offset") >= offset))
    return condition


def _unseen_records(marks: Offsets, topics: Iterable[str]) -> Column:
    from pyspark.sql import functions as F

    condition = F.lit(False)
    for topic in topics:
        condition = condition | ((F.col("topic") == topic) & _unseen(marks.get(topic, {})))
    return condition


def _at_or_after(place: Place) -> Column:
    from pyspark.sql import functions as F

    partition, offset, index = place
    column_p, column_o, column_i = F.col("partition"), F.col("offset"), F.col("idx")
    return (column_p > partition) | (
        (column_p == partition)
        & ((column_o > offset) | ((column_o == offset) & (column_i >= index)))
    )


@dataclass
class Fence:
    """The batch's fence, from its elections: each group's epoch before the batch and the
    places where an admitted election raised it."""

    before: dict[str, int]
    raised: dict[str, list[tuple[Place, int]]]
    after: dict[str, int]
    pauses: list[tuple[str, Event]] = field(default_factory=list)
    """The admitted `paused` and `resumed` events with their groups, in log order."""
    limits: list[tuple[str, Event]] = field(default_factory=list)
    """The admitted `limit_set` and `limit_removed` events with their groups, in log order."""

    def admitted(self) -> Column:
        """True for an event the fence admits (its epoch is not below its group's fence at its
        place)."""
        from pyspark.sql import functions as F

        threshold = F.lit(0)  # a group never seen: EpochFence() admits every epoch
        for group in sorted(set(self.before) | set(self.raised)):
            epoch = F.lit(self.before.get(group, 0))
            for place, raised_to in self.raised.get(group, []):
                epoch = F.when(_at_or_after(place), F.lit(raised_to)).otherwise(epoch)
            threshold = F.when(F.col("dispatch_group") == group, epoch).otherwise(threshold)
        return F.col("epoch") >= threshold


def run_fence(
    before: Mapping[str, int], groups: Iterable[str], control: Sequence[Mapping[str, Any]]
) -> tuple[Fence, list[PruneEvent]]:
    """The fence over the batch's elections, prunes, pauses, resumes and limits (`control`:
    their `events` rows), and the admitted prunes (the admitted pauses, resumes and limits
    are in the `Fence`)."""
    fences = {group: EpochFence(epoch) for group, epoch in before.items()}
    for group in groups:
        fences.setdefault(group, EpochFence())
    raised: dict[str, list[tuple[Place, int]]] = {}
    prunes: list[PruneEvent] = []
    pauses: list[tuple[str, Event]] = []
    limits: list[tuple[str, Event]] = []
    for row in sorted(control, key=lambda row: (row["partition"], row["offset"], row["idx"])):
        logged = logged_event(row)
        fence = fences.setdefault(logged.group, EpochFence())
        if not fence.admit(logged.event):
            continue
        place = (logged.partition, logged.offset, logged.index)
        if isinstance(logged.event, LeaderElected):
            raised.setdefault(logged.group, []).append((place, fence.epoch))
        elif isinstance(logged.event, Pruned):
            prunes.append(PruneEvent(*place, logged.group, logged.record_epoch, row["body"]))
        elif isinstance(logged.event, Paused | Resumed):
            pauses.append((logged.group, logged.event))
        elif isinstance(logged.event, LimitSet | LimitRemoved):
            limits.append((logged.group, logged.event))
    after = {group: fence.epoch for group, fence in fences.items()}
    return Fence(dict(before), raised, after, pauses, limits), prunes


def plan_on_executors(writer: BatchWriter, batch_df: DataFrame, batch_id: int) -> Planned:
    """Fold one batch on the executors (see the module's docstring)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    spark = batch_df.sparkSession
    topics = writer.topics
    positions = writer.positions()
    fold_mark = positions.tables[t.JOBS]
    events_mark = positions.tables[t.EVENTS]
    # Read from Kafka once: every later step (the explode, the other topics' rows, the rare
    # `rejected` rows) reads the batch again, and the source filters no topic.
    records = batch_df.select(
        "topic", "partition", "offset", "key", "value",
        F.unix_micros("timestamp").alias("timestamp"),
    ).persist(StorageLevel.MEMORY_AND_DISK)  # fmt: skip
    # The events topic may have a single partition: spread its records over every core before
    # decoding them (the fold sorts by place, so their order here does not matter).
    events_records = records.where(_unseen_records(fold_mark, [topics.events])).repartition(
        spark.sparkContext.defaultParallelism
    )
    exploded = _map_in_arrow(
        events_records,
        functools.partial(explode_records, batch_id=batch_id),
        t.SCHEMAS[t.EVENTS],
    ).persist(StorageLevel.MEMORY_AND_DISK)
    # Cached until the batch is written: the plan's frames are read again by the writes.
    cached = [records, exploded]
    try:
        planned = _plan(writer, spark, records, exploded, batch_id, fold_mark, events_mark, cached)
    except BaseException:
        _unpersist(cached)
        raise
    planned.release = functools.partial(_unpersist, cached)
    return planned


def _unpersist(frames: Sequence[DataFrame]) -> None:
    for frame in reversed(frames):
        frame.unpersist()


def _plan(
    writer: BatchWriter,
    spark: Any,
    records: DataFrame,
    exploded: DataFrame,
    batch_id: int,
    fold_mark: Offsets,
    events_mark: Offsets,
    cached: list[DataFrame],
) -> Planned:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    topics = writer.topics
    positions = writer.positions()
    is_event = F.col("kind") == EVENT_KIND
    # Step 2: the rows the fence, the prunes and the refusals depend on (few), and a row per
    # group the batch's events name, in one Spark job.
    columns = ["kind", "dispatch_group", *_PLACE_COLUMNS]
    names_groups = (
        exploded.where(is_event)
        .select("dispatch_group")
        .distinct()
        .select(
            F.lit(_GROUP_ROW).alias("kind"),
            *[
                _null(exploded.schema, name)
                for name in columns
                if name not in ("kind", "dispatch_group")
            ],
            "dispatch_group",
        )
    )
    rows = [
        row.asDict()
        for row in exploded.where(~is_event | F.col("type").isin(*_CONTROL_TYPES))
        .select(*columns)
        .unionByName(names_groups)
        .collect()
    ]
    control = [row for row in rows if row["kind"] != _GROUP_ROW]
    groups = [row["dispatch_group"] for row in rows if row["kind"] == _GROUP_ROW]
    fence, prunes = run_fence(
        positions.fence, groups, [row for row in control if row["kind"] == EVENT_KIND]
    )
    admitted = fence.admitted()

    # Step 3: the fold, partitioned by job.
    fold_input = t.spark_schema_of(FOLD_INPUT)
    job_events = exploded.where(is_event & F.col("job_id").isNotNull() & admitted).select(
        "dispatch_group", "job_id", "partition", "offset", "idx", "record_epoch", "body",
        _null(fold_input, "row"),
    )  # fmt: skip
    touched = job_events.select("dispatch_group", "job_id").distinct()
    # The version read is pinned: the MERGE narrows its scan by the `seq` of the rows read
    # here only if nothing changed the open rows since (`BatchWriter._spark_merge_jobs`).
    jobs_version = writer.commits.table(t.JOBS).version()
    jobs = (
        spark.read.format("delta")
        .option("versionAsOf", jobs_version)
        .load(writer.warehouse.table(t.JOBS))
    )
    part = F.col("part") == OPEN
    prune_groups = sorted({prune.group for prune in prunes})
    if prune_groups:
        part = part | F.col("dispatch_group").isin(*prune_groups)
    current = (
        jobs.where(part)
        .alias("j")
        .join(
            touched.alias("k"),
            (F.col("j.dispatch_group") == F.col("k.dispatch_group"))
            & (F.col("j.id") == F.col("k.job_id")),
            "left_semi",
        )
    )
    current_rows = current.select(
        F.col("dispatch_group"),
        F.col("id").alias("job_id"),
        *[
            _null(fold_input, name)
            for name in ("partition", "offset", "idx", "record_epoch", "body")
        ],
        F.struct(*[F.col(name) for name in t.SCHEMAS[t.JOBS].names]).alias("row"),
    )
    stats_from = dict(positions.tables[t.STATS_PARTIAL].get(topics.events, {}))
    by_job = job_events.unionByName(current_rows).repartition(
        spark.sparkContext.defaultParallelism, "dispatch_group", "job_id"
    )
    folded_frame = _map_in_arrow(
        by_job,
        functools.partial(fold_partition, prunes=prunes, stats_from=stats_from),
        FOLD_OUTPUT,
    ).persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(folded_frame)
    is_job = F.col("kind") == KIND_JOB
    with _described(spark, f"{FOLD_JOB}, batch {batch_id}"):
        # The fold runs here, once (cached): the jobs' rows stay on the executors for Spark's
        # MERGE; what comes to the driver is their count and the few other rows.
        jobs_rows = folded_frame.where(is_job).count()
    folded = folded_frame.where(~is_job).toArrow()
    kinds = folded.column("kind")

    def of_kind(kind: str, column: str) -> pa.ChunkedArray:
        return folded.filter(pc.equal(kinds, kind)).column(column)

    jobs_frame = folded_frame.where(is_job).select(
        *[F.col(f"job.{field.name}").alias(field.name) for field in JOB_ROW]
    )
    refusals = (
        folded.filter(pc.equal(kinds, KIND_REFUSED))
        .select(["partition", "offset", "idx", "reason"])
        .to_pylist()
    )
    # Each partition counted its own jobs: summed per key, one `stats_partial` row a key.
    stats = aggregate(of_kind(KIND_STATS, "stats").to_pylist())
    archived = [dict(row) for row in of_kind(KIND_ARCHIVED, "archived").to_pylist()]
    seq_ranges = list(
        zip(
            of_kind(KIND_OPEN_SEQS, "seq_low").to_pylist(),
            of_kind(KIND_OPEN_SEQS, "seq_high").to_pylist(),
            strict=True,
        )
    )

    # Step 4: the `events` rows with their fence verdict, and the other topics' rows.
    others = _map_in_arrow(
        records.where(_unseen_records(events_mark, [topics.submit, topics.rejected])),
        functools.partial(explode_other_records, batch_id=batch_id, submit_topic=topics.submit),
        t.SCHEMAS[t.EVENTS],
    )
    bronze_frame = (
        exploded.where(_unseen_records(events_mark, [topics.events]))
        .withColumn("admitted", F.when(is_event, admitted).otherwise(F.lit(None)))
        .unionByName(others)
    )
    events = _events_rows(bronze_frame, refusals, topics.rejected, cached)

    if any(row["kind"] != EVENT_KIND for row in control) or refusals or events.has_rejected:
        rejected, skipped, first = _rejected(writer, records, batch_id, control, refusals)
    else:
        rejected, skipped, first = t.empty_table(t.REJECTED), 0, None
    touched_keys: set[JobKey] = set()
    closed_touched: list[JobKey] = []
    if prunes:
        touched_keys = {(row[0], row[1]) for row in touched.collect()}
        closed_touched = [
            (row[0], row[1])
            for row in current.where(F.col("part") != OPEN).select("dispatch_group", "id").collect()
        ]
    return Planned(
        events=events.arrow,
        rejected=rejected,
        stats=stats,
        jobs_source=JOBS_SOURCE.empty_table(),
        fence_after=fence.after,
        pauses=fence.pauses,
        limits=fence.limits,
        archived=archived,
        prunes=prune_steps(prunes),
        touched=touched_keys,
        closed_touched=closed_touched,
        events_count=events.logged,
        skipped_records=skipped,
        first_reason=first,
        on_executors=ExecutorRows(
            jobs=jobs_frame,
            jobs_rows=jobs_rows,
            events=events.frame,
            events_rows=events.rows,
            jobs_version=jobs_version,
            open_seqs=cover_ranges(
                [(low, high) for low, high in seq_ranges if low is not None], SEQ_RANGES
            ),
            open_seq_null=any(low is None for low, _ in seq_ranges),
        ),
    )


@dataclass
class _EventsRows:
    """A batch's `events` rows: on the executors (`frame`) or, with refusals, on the driver
    (`arrow`), with their counts."""

    arrow: pa.Table
    frame: DataFrame | None
    rows: int
    logged: int
    """Rows of logged events (the other rows are submissions and rejections)."""
    has_rejected: bool
    """Whether a row comes from the rejected topic."""


def _events_rows(
    bronze: DataFrame, refusals: Sequence[Mapping[str, Any]], rejected_topic: str, cached: list[Any]
) -> _EventsRows:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    events_schema = t.spark_schema_of(t.SCHEMAS[t.EVENTS])
    typed = bronze.select(*[F.col(f.name).cast(f.dataType) for f in events_schema.fields])
    if refusals:
        # Rare: the refused events' rows carry their reasons, set row by row on the driver.
        arrow = _with_refusals(typed.toArrow().cast(t.SCHEMAS[t.EVENTS]), refusals)
        return _EventsRows(
            arrow=arrow,
            frame=None,
            rows=arrow.num_rows,
            logged=int(pc.sum(pc.equal(arrow.column("kind"), EVENT_KIND)).as_py() or 0),
            has_rejected=_has(arrow, rejected_topic),
        )
    frame = typed.persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(frame)
    counts = frame.groupBy("kind", "topic").count().collect()
    return _EventsRows(
        arrow=t.empty_table(t.EVENTS),
        frame=frame,
        rows=sum(int(row["count"]) for row in counts),
        logged=sum(int(row["count"]) for row in counts if row["kind"] == EVENT_KIND),
        has_rejected=any(row["topic"] == rejected_topic for row in counts),
    )


def _null(schema: Any, name: str) -> Column:
    """A NULL of the type of the Spark `schema`'s field `name`, named `name`."""
    from pyspark.sql import functions as F

    return F.lit(None).cast(schema[name].dataType).alias(name)


def _has(bronze: pa.Table, topic: str) -> bool:
    """Whether the batch's `events` rows hold a record of `topic`."""
    return bool(pc.any(pc.equal(bronze.column("topic"), topic)).as_py())


def _with_refusals(bronze: pa.Table, refusals: Sequence[Mapping[str, Any]]) -> pa.Table:
    """The `error` of each event row the fold refused (a rare batch: done row by row)."""
    why = {(row["partition"], row["offset"], row["idx"]): row["reason"] for row in refusals}
    errors = bronze.column("error").to_pylist()
    places = zip(
        bronze.column("kind").to_pylist(),
        bronze.column("partition").to_pylist(),
        bronze.column("offset").to_pylist(),
        bronze.column("idx").to_pylist(),
        strict=True,
    )
    for position, (kind, partition, offset, index) in enumerate(places):
        if kind == EVENT_KIND and (partition, offset, index) in why:
            errors[position] = why[(partition, offset, index)]
    column = bronze.schema.get_field_index("error")
    return bronze.set_column(column, "error", pa.array(errors, pa.string()))


def _rejected(
    writer: BatchWriter,
    records: DataFrame,
    batch_id: int,
    control: Sequence[Mapping[str, Any]],
    refusals: Sequence[Mapping[str, Any]],
) -> tuple[pa.Table, int, str | None]:
    """The batch's `rejected` rows, by the driver's own code over the few records that need
    one: the rejection records, and the events records not taken whole."""
    from pyspark.sql import functions as F

    from dispatch.streaming.batch import _Plan

    topics = writer.topics
    positions = writer.positions()
    troubled = {(row["partition"], row["offset"]) for row in control if row["kind"] != EVENT_KIND}
    troubled |= {(row["partition"], row["offset"]) for row in refusals}
    wanted = _unseen_records(positions.tables[t.REJECTED], [topics.rejected])
    if troubled:
        names = [f"{partition}:{offset}" for partition, offset in sorted(troubled)]
        place = F.concat_ws(":", F.col("partition"), F.col("offset"))
        wanted = wanted | ((F.col("topic") == topics.events) & place.isin(*names))
    rows: list[KafkaRow] = kafka_rows(records.where(wanted).toArrow().to_pydict())
    by_topic: dict[str, list[KafkaRow]] = {topic: [] for topic in topics.all()}
    for row in sorted(rows, key=lambda row: (row.topic, row.partition, row.offset)):
        by_topic.setdefault(row.topic, []).append(row)
    decoded, undecodable = decode_events(by_topic[topics.events])
    logged, screened = screen_events(decoded)
    at = {(event.partition, event.offset, event.index): event for event in logged}
    fold = BatchFold(
        refused=[
            Refused(at[(row["partition"], row["offset"], row["idx"])], row["reason"])
            for row in refusals
        ]
    )
    plan = _Plan(
        by_topic=by_topic,
        fold_rows=by_topic[topics.events],
        logged=logged,
        admitted=[True] * len(logged),
        undecodable=undecodable,
        screened=screened,
        fence_after={},
        touched=set(),
        current={},
        fold=fold,
    )
    skipped, first = plan.skipped()
    return t.arrow_rows(t.REJECTED, writer.rejected_rows(batch_id, plan)), skipped, first

"""`foreachBatch`: one micro-batch of the three topics -> the Delta tables, exactly once.

Order of the writes (the `jobs` MERGE is always last, so "jobs covers batch N" means every
table does):

1. `events` append (bronze), 2. `rejected` append, 3. `stats_partial` append, 4. in a batch
with `pruned` events: `jobs_archive` append, then a `jobs` MERGE deleting the pruned rows,
5. in a batch with `paused`/`resumed` events: the `pauses` table rewritten whole
(`dispatch.delta.pauses`); in a batch with `limit_set`/`limit_removed` events: the `limits`
table rewritten whole (`dispatch.delta.limits`), 6. the `jobs` MERGE of the folded states,
with the batch's `Progress` (offsets, fence epochs).

The batch is folded on Spark's executors, partitioned by job (`dispatch.streaming.executor_plan`),
or, with `fold_on="driver"`, collected to the driver and folded there (`_plan`); either way the
result is a `Planned` (every table's rows in Arrow) that `write_planned` commits. The appends
and the `jobs` MERGE are delta-rs commits from those rows (`dispatch.streaming.delta_commits`: a
Spark write per table cost seconds of fixed overhead a batch, BENCHMARKS.md, *Streaming*), the rare
prune step stays in Spark
(it selects closed rows by a condition over the history).

Exactly-once effect, two layers:
- Delta idempotent writes keyed on the batch: every commit carries a `txn` action with app id
  = the streaming query's id (new with every new checkpoint, so a fresh checkpoint whose batch
  ids restart at 0 is never skipped) and version = the batch id; a table that already holds
  that version is not written again (delta-rs commits: checked by `DeltaCommits.append` /
  `merge` against the table's recorded `txn` version before writing, and a `jobs` MERGE with
  nothing to write still commits its `txn` and progress; the Spark prune MERGE
  and `jobs_archive` append: by Spark itself, from the session confs
  `spark.databricks.delta.write.txnAppId` / `txnVersion` and the writer's options).
- Offset watermarks: every commit records the Kafka positions its table has absorbed, and each
  table only takes the records after its own position. This also makes a run from a deleted
  checkpoint (which restarts from the positions recorded in `jobs`) exact, even when its batch
  boundaries differ from the lost ones.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from dispatch.core.events import Event, JobEvent
from dispatch.delta import tables as t
from dispatch.delta.job_rows import CLOSED, OPEN, JobKey, JobState, job_row, job_state
from dispatch.delta.limits import LimitRows, apply_limits, arrow_limits, is_limit_event, limits_at
from dispatch.delta.pauses import PauseRows, apply_pauses, arrow_pauses, is_pause_event, pauses_at
from dispatch.delta.progress import BATCH, PRUNE, Committed, Offsets, Progress, latest_progress_of
from dispatch.delta.stats import MinuteStats, StatsKey
from dispatch.storage import Location
from dispatch.streaming import guard, spark_writes
from dispatch.streaming.decode import (
    RECORD_ERRORS,
    KafkaRow,
    LoggedEvent,
    Refused,
    Topics,
    Undecodable,
    advance,
    decode_events,
    event_bronze_row,
    kafka_rows,
    merge_offsets,
    refusal_reason,
    refused_bronze_row,
    refused_record_row,
    rejected_bronze_row,
    rejected_row,
    screen_events,
    submit_bronze_row,
    undecodable_bronze_row,
    unseen,
)
from dispatch.streaming.delta_commits import DeltaCommits
from dispatch.streaming.fold import (
    BatchFold,
    archived_row,
    fence_batch,
    fold_batch,
    place,
    prune_groups,
    touched_jobs,
)
from dispatch.streaming.open_jobs import OpenJobs, narrowing, ranges_condition
from dispatch.streaming.planned import JOBS_SOURCE, Planned
from dispatch.streaming.rollup import StatsRollup, stats_row
from dispatch.streaming.spark_writes import ExecutorRows
from dispatch.warehouse import Warehouse

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession

    from dispatch.streaming.maintenance import Maintenance

log = logging.getLogger(__name__)

UTC = dt.UTC
_JOB_COLUMNS: list[str] = list(t.SCHEMAS[t.JOBS].names)
_JOBS_MERGE_COLUMNS = {name: f"s.`{name}`" for name in _JOB_COLUMNS}
DRIVER = "driver"
EXECUTORS = "executors"
_KEEPS_ROWS = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END"})
"""Operations that commit the same rows (in other files, or none removed)."""


def _jobs_merge_predicate(narrowed: str = "") -> str:
    """The `jobs` MERGE's condition. Only open jobs can change: the partition literal keeps
    the closed history (the bulk of the table) out of the scan, and `narrowed` (a condition on
    target columns, see `_merge_jobs`) the files of the queued backlog the batch does not touch."""
    files = f" AND {narrowed}" if narrowed else ""
    return f"t.part = '{OPEN}'{files} AND t.dispatch_group = s.dispatch_group AND t.id = s.id"


def _advanced(start: Offsets, end: Offsets) -> int:
    """How many offsets a batch moves the positions by (records, and transaction markers)."""
    return sum(
        offset - start.get(topic, {}).get(partition, 0)
        for topic, partitions in end.items()
        for partition, offset in partitions.items()
    )


def query_id(checkpoint: Location) -> str:
    """The streaming query's persistent id, from the checkpoint's `metadata` file: the same
    across restarts from this checkpoint, new with a new checkpoint."""
    document = json.loads(checkpoint.child("metadata").read_text().splitlines()[0])
    return str(document["id"])


def batch_end_offsets(checkpoint: Location, batch_id: int) -> Offsets | None:
    """The end offsets of `batch_id` from the query's offset log (written before the batch
    runs), or None if unreadable. With read_committed these sit after a transaction's commit
    marker, so a caught-up query shows zero lag."""
    try:
        lines = checkpoint.child("offsets", str(batch_id)).read_text().splitlines()
        # Line 1: log version, line 2: batch metadata, then one line per source.
        source = json.loads(lines[2])
        return {
            str(topic): {int(partition): int(offset) for partition, offset in parts.items()}
            for topic, parts in source.items()
        }
    except (OSError, IndexError, ValueError, AttributeError) as error:
        log.warning("cannot read the offsets of batch %d: %r", batch_id, error)
        return None


@dataclass
class BatchTimings:
    """Where one batch's time went (seconds), for logs and the benchmark."""

    batch_id: int = -1
    records: int = 0
    events: int = 0
    jobs: int = 0
    collect_s: float = 0.0
    fold_s: float = 0.0
    read_s: float = 0.0
    """Of `fold_s`: reading the touched jobs' current rows (the driver's fold only)."""
    events_write_s: float = 0.0
    stats_write_s: float = 0.0
    prune_s: float = 0.0
    jobs_merge_s: float = 0.0
    rollup_s: float = 0.0
    maintenance_s: float = 0.0
    maintenance_steps: int = 0
    total_s: float = 0.0
    on_executors: bool = False
    """Folded on Spark's executors (else collected and folded on the driver)."""


@dataclass(frozen=True)
class _Plan:
    """A decoded and folded batch, before any write."""

    by_topic: dict[str, list[KafkaRow]]
    fold_rows: list[KafkaRow]
    """The events-topic records `jobs` has not absorbed yet."""
    logged: list[LoggedEvent]
    """The decoded events the tables can hold (fenced and folded)."""
    admitted: list[bool]
    undecodable: list[Undecodable]
    screened: list[Refused]
    """Decoded events whose values no table can hold (neither fenced nor folded)."""
    fence_after: dict[str, int]
    touched: set[JobKey]
    current: dict[JobKey, JobState]
    fold: BatchFold
    read_s: float = 0.0
    """How long reading `current` took."""
    open_seqs: list[int | None] | None = None
    """The `seq` of each touched job's row in the open partition, as stored (see
    `BatchWriter._merge_jobs`)."""

    def skipped(self) -> tuple[int, str | None]:
        """How many events records the fold did not take whole, and why the first was not."""
        refusals = self.refusals()
        first: str | None = None
        if self.undecodable:
            first = self.undecodable[0].reason
        elif refusals:
            first = refusal_reason(next(iter(refusals.values()))[0])
        return len(self.undecodable) + len(refusals), first

    def refusals(self) -> dict[tuple[int, int], list[Refused]]:
        """Every refused event (screened out or not fitting its job), by its record's
        (partition, offset), in log order."""
        out: dict[tuple[int, int], list[Refused]] = {}
        for refused in sorted(
            [*self.screened, *self.fold.refused],
            key=lambda r: (r.logged.partition, r.logged.offset, r.logged.index),
        ):
            out.setdefault((refused.logged.partition, refused.logged.offset), []).append(refused)
        return out


@dataclass
class _Positions:
    """Per table, the positions it has absorbed; and each group's fence epoch."""

    tables: dict[str, Offsets]
    fence: dict[str, int]


def _read_partition(table: DeltaTable, part: str, ids: pa.Array) -> pa.Table:
    """The rows of partition `part` of `jobs` whose id is one of `ids`.

    The partition is pruned by delta-rs (from the log); the ids are matched after the read,
    not pushed down: pyarrow's pushdown fails on files delta-rs's MERGE wrote (`string_view`,
    see dispatch/delta_sql.py), and DataFusion overflows its stack on an IN list of tens of
    thousands of ids (a segfault at ~50k, deltalake 1.6.6). Ids are random (clients choose
    them), so no file statistics could narrow the read either: it costs the whole partition,
    hence the cache of the open one (`dispatch.streaming.open_jobs`)."""
    read = table.to_pyarrow_dataset(file_pruning_predicate=[("part", "=", part)]).to_table()
    found = read.filter(pc.is_in(read["id"], value_set=ids))
    return found.select(_JOB_COLUMNS).cast(t.SCHEMAS[t.JOBS])


def control_events(
    logged: Sequence[LoggedEvent], admitted: Sequence[bool], chosen: Callable[[Event], bool]
) -> list[tuple[str, Event]]:
    """The admitted events `chosen` keeps (`paused` and `resumed`: `is_pause_event`;
    `limit_set` and `limit_removed`: `is_limit_event`) with their groups, in log order."""
    kept = [entry for entry, ok in zip(logged, admitted, strict=True) if ok and chosen(entry.event)]
    kept.sort(key=lambda entry: (entry.partition, entry.offset, entry.index))
    return [(entry.group, entry.event) for entry in kept]


class BatchWriter:
    """The `foreachBatch` function. One instance per running query."""

    def __init__(
        self,
        warehouse: Warehouse,
        topics: Topics,
        checkpoint: Location,
        maintenance: Maintenance | None = None,
        rollup: StatsRollup | None = None,
        fold_on: str = DRIVER,
        cache_open_jobs: bool = True,
        executor_min_records: int = 0,
    ) -> None:
        if fold_on not in (DRIVER, EXECUTORS):
            raise ValueError(f"fold_on: expected {DRIVER!r} or {EXECUTORS!r}, got {fold_on!r}")
        self.fold_on = fold_on
        """Where a batch is folded: on Spark's executors (`dispatch.streaming.executor_plan`), or
        collected to the driver and folded there (`_plan`)."""
        self.executor_min_records = executor_min_records
        """With `fold_on = executors`, a batch of fewer Kafka records is folded on the driver
        all the same (`SparkSettings.executor_fold_min_records`)."""
        self.warehouse = warehouse
        self.topics = topics
        self.checkpoint = checkpoint
        self.maintenance = maintenance
        self.rollup = rollup
        self._app_id: str | None = None
        self._positions: _Positions | None = None
        self.commits = DeltaCommits(warehouse)
        self.cache_open_jobs = cache_open_jobs
        """The driver's fold keeps the open partition of `jobs` in memory between batches
        (`dispatch.streaming.open_jobs`) instead of reading it each batch."""
        self._open: OpenJobs | None = None
        self._pauses: PauseRows | None = None
        """The pauses in force at the offsets `jobs` covers (see `dispatch.delta.pauses`)."""
        self._limits: LimitRows | None = None
        """The runtime limits in force at the offsets `jobs` covers (`dispatch.delta.limits`)."""
        self.open_jobs_loads = 0
        """How many times the open partition was read whole into the cache."""
        self.last: BatchTimings | None = None
        self.history: list[BatchTimings] = []

    # --- the positions each table has absorbed --------------------------------------------

    @property
    def has_app_id(self) -> bool:
        """True once the query's checkpoint exists (after its first batch started)."""
        return self._app_id is not None or self.checkpoint.child("metadata").has_files()

    @property
    def app_id(self) -> str:
        if self._app_id is None:
            self._app_id = f"dispatch-streaming-{query_id(self.checkpoint)}"
        return self._app_id

    def positions(self) -> _Positions:
        """Loaded from the tables' newest commits once per process, then kept up to date."""
        if self._positions is None:
            jobs = self._latest_progress(t.JOBS)
            covered: Offsets = jobs.progress.offsets if jobs else {}
            fence = dict(jobs.progress.fence) if jobs else {}
            tables: dict[str, Offsets] = {t.JOBS: covered}
            for name in (t.EVENTS, t.REJECTED, t.STATS_PARTIAL, t.JOBS_ARCHIVE):
                own = self._latest_progress(name)
                # Everything `jobs` covers, every table covers (jobs is written last).
                tables[name] = merge_offsets(covered, own.progress.offsets if own else {})
            self._positions = _Positions(tables, fence)
        return self._positions

    def _latest_progress(self, name: str) -> Committed | None:
        """The newest batch commit of table `name` (None: no table, or no such commit yet),
        read through the open handle."""
        from deltalake.exceptions import TableNotFoundError

        try:
            table = self.commits.table(name)
        except TableNotFoundError:
            return None
        return latest_progress_of(table, BATCH)

    def _progress(self, batch_id: int, offsets: Offsets, kind: str = BATCH) -> Progress:
        positions = self.positions()
        return Progress(
            app_id=self.app_id,
            batch_id=batch_id,
            kind=kind,
            offsets=offsets,
            topics={
                "submit": self.topics.submit,
                "events": self.topics.events,
                "rejected": self.topics.rejected,
            },
            fence=dict(positions.fence),
        )

    # --- the batch --------------------------------------------------------------------------

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        try:
            self._process(batch_df, batch_id)
        except BaseException:
            # A write may or may not have committed: reload the positions (and the open jobs)
            # from the tables before the batch is retried.
            self._positions = None
            self._open = None
            self._pauses = None
            self._limits = None
            raise

    def _process(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        if self.fold_on == EXECUTORS:
            end = self._end_on_executors(batch_df, batch_id)
            records = _advanced(self.positions().tables[t.JOBS], end)
            if records >= self.executor_min_records:
                self._fold_on_executors(batch_df, batch_id, end, records, started)
                return
            # A small batch: the executors' fold costs seconds of Spark jobs whatever the
            # batch's size, the driver's a fraction of one (docs/streaming.md).
        self._fold_on_driver(batch_df, batch_id, started)

    def _end_on_executors(self, batch_df: DataFrame, batch_id: int) -> Offsets:
        """The batch's end offsets from the checkpoint, or else from Spark (no collect)."""
        from pyspark.sql import functions as F

        end = batch_end_offsets(self.checkpoint, batch_id)
        if end is None:
            ends = batch_df.groupBy("topic", "partition").agg(F.max("offset")).collect()
            end = {}
            for topic, partition, last in ends:
                end.setdefault(topic, {})[partition] = last + 1
        return merge_offsets(self.positions().tables[t.JOBS], end)

    def _fold_on_executors(
        self, batch_df: DataFrame, batch_id: int, end: Offsets, records: int, started: float
    ) -> None:
        from dispatch.streaming.executor_plan import plan_on_executors

        timings = BatchTimings(batch_id=batch_id, records=records, on_executors=True)
        mark = time.perf_counter()
        planned = plan_on_executors(self, batch_df, batch_id)
        timings.fold_s = time.perf_counter() - mark
        try:
            self.write_planned(
                batch_id, planned, end, timings, spark=batch_df.sparkSession, started=started
            )
        finally:
            planned.release()

    def _fold_on_driver(self, batch_df: DataFrame, batch_id: int, started: float) -> None:
        from pyspark.sql import functions as F

        positions = self.positions()
        # The time as microseconds: a producer-set time past year 9999 would make the
        # conversion to Python datetimes raise for the whole batch (kafka_rows clamps it).
        arrow = batch_df.select(
            "topic", "partition", "offset", "key", "value",
            F.unix_micros("timestamp").alias("timestamp"),
        )  # fmt: skip
        rows = kafka_rows(arrow.toArrow().to_pydict())
        end = batch_end_offsets(self.checkpoint, batch_id)
        if end is None:
            end = advance(positions.tables[t.JOBS], rows)
        end = merge_offsets(positions.tables[t.JOBS], end)
        self.write_batch(batch_id, rows, end, spark=batch_df.sparkSession, started=started)

    def write_batch(
        self,
        batch_id: int,
        rows: Sequence[KafkaRow],
        end: Offsets,
        *,
        spark: SparkSession | None = None,
        started: float | None = None,
    ) -> BatchTimings:
        """Fold on the driver and write one batch of records (in log order) whose end offsets
        are `end`. Spark is needed only for a batch with `pruned` events and for maintenance."""
        started = time.perf_counter() if started is None else started
        timings = BatchTimings(batch_id=batch_id, records=len(rows))
        timings.collect_s = time.perf_counter() - started
        mark = time.perf_counter()
        plan = self._plan(rows)
        planned = self.planned(batch_id, plan)
        timings.fold_s = time.perf_counter() - mark
        timings.read_s = plan.read_s
        return self.write_planned(batch_id, planned, end, timings, spark=spark, started=started)

    def write_planned(
        self,
        batch_id: int,
        planned: Planned,
        end: Offsets,
        timings: BatchTimings,
        *,
        spark: SparkSession | None = None,
        started: float,
    ) -> BatchTimings:
        """Write a planned batch, in the order the module's docstring gives."""
        positions = self.positions()
        on_executors = planned.on_executors
        timings.events = planned.events_count
        timings.jobs = (
            planned.jobs_source.num_rows if on_executors is None else on_executors.jobs_rows
        )
        self._log_refusals(batch_id, planned)

        mark = time.perf_counter()
        if on_executors is not None and on_executors.events is not None:
            if on_executors.events_rows:
                spark_writes.append(
                    on_executors.events,
                    self.warehouse.table(t.EVENTS),
                    app_id=self.app_id,
                    version=batch_id,
                    metadata=self._progress(batch_id, end).to_json(),
                )
        elif planned.events.num_rows:
            self._append(t.EVENTS, planned.events, batch_id, self._progress(batch_id, end))
        timings.events_write_s = time.perf_counter() - mark
        mark = time.perf_counter()
        self._write_stats_partial(batch_id, end, planned.stats)
        if planned.rejected.num_rows:
            self._append(t.REJECTED, planned.rejected, batch_id, self._progress(batch_id, end))
        timings.stats_write_s = time.perf_counter() - mark

        mark = time.perf_counter()
        if planned.prunes:
            if spark is None:
                raise RuntimeError("a batch with pruned events needs the Spark session")
            self._write_prunes(spark, batch_id, end, planned)
        timings.prune_s = time.perf_counter() - mark

        controls = self._write_controls(batch_id, end, planned)

        mark = time.perf_counter()
        positions.fence = planned.fence_after
        if on_executors is None:
            self._merge_jobs(batch_id, end, planned.jobs_source, planned.open_seqs)
        else:
            if spark is None:
                raise RuntimeError("a batch folded on the executors needs the Spark session")
            self._spark_merge_jobs(spark, batch_id, end, on_executors)
        for name in positions.tables:
            positions.tables[name] = end
        self._keep_controls(*controls)
        timings.jobs_merge_s = time.perf_counter() - mark

        if self.rollup is not None and self.rollup.due():
            mark = time.perf_counter()
            self.rollup.run(self.app_id)
            timings.rollup_s = time.perf_counter() - mark
        if self.maintenance is not None and spark is not None:
            mark = time.perf_counter()
            timings.maintenance_steps = len(self.maintenance.run_due(spark))
            timings.maintenance_s = time.perf_counter() - mark
        timings.total_s = time.perf_counter() - started
        self.last = timings
        self.history.append(timings)
        del self.history[:-1000]
        log.info(
            "batch %d: %d records, %d events, %d jobs in %.2fs (fold on the %s %.2fs, jobs "
            "merge %.2fs)",
            batch_id, timings.records, timings.events, timings.jobs, timings.total_s,
            EXECUTORS if timings.on_executors else DRIVER, timings.fold_s, timings.jobs_merge_s,
        )  # fmt: skip
        return timings

    def _write_controls(
        self, batch_id: int, end: Offsets, planned: Planned
    ) -> tuple[PauseRows | None, LimitRows | None]:
        """Rewrite `pauses` and `limits` if the batch changes them (before the `jobs` commit):
        the pauses and the runtime limits in force after the batch (None: unchanged)."""
        return (
            self._write_pauses(batch_id, end, planned.pauses),
            self._write_limits(batch_id, end, planned.limits),
        )

    def _keep_controls(self, pauses: PauseRows | None, limits: LimitRows | None) -> None:
        """Once `jobs` covers the batch: its pauses and limits are those in force."""
        if pauses is not None:
            self._pauses = pauses
        if limits is not None:
            self._limits = limits

    def pauses_in_force(self) -> PauseRows:
        """The pauses in force at the offsets `jobs` covers: read from `pauses` once, then kept
        up to date by the batches."""
        if self._pauses is None:
            covered = self.positions().tables[t.JOBS].get(self.topics.events, {})
            self._pauses = pauses_at(self.warehouse, self.topics.events, covered)
        return self._pauses

    def _write_pauses(
        self, batch_id: int, end: Offsets, events: Sequence[tuple[str, Event]]
    ) -> PauseRows | None:
        """Rewrite `pauses` with the batch's pauses and resumes applied, before the `jobs`
        commit (the pauses in force after the batch; None: the batch has none)."""
        if not events:
            return None
        pauses = dict(self.pauses_in_force())
        apply_pauses(pauses, events)
        self.commits.overwrite(
            t.PAUSES,
            arrow_pauses(pauses),
            app_id=self.app_id,
            version=batch_id,
            metadata=self._progress(batch_id, end).to_json(),
        )
        return pauses

    def limits_in_force(self) -> LimitRows:
        """The runtime limits in force at the offsets `jobs` covers: read from `limits` once,
        then kept up to date by the batches."""
        if self._limits is None:
            covered = self.positions().tables[t.JOBS].get(self.topics.events, {})
            self._limits = limits_at(self.warehouse, self.topics.events, covered)
        return self._limits

    def _write_limits(
        self, batch_id: int, end: Offsets, events: Sequence[tuple[str, Event]]
    ) -> LimitRows | None:
        """Rewrite `limits` with the batch's limits set and removed applied, before the `jobs`
        commit (the runtime limits in force after the batch; None: the batch has none)."""
        if not events:
            return None
        limits = dict(self.limits_in_force())
        apply_limits(limits, events)
        self.commits.overwrite(
            t.LIMITS,
            arrow_limits(limits),
            app_id=self.app_id,
            version=batch_id,
            metadata=self._progress(batch_id, end).to_json(),
        )
        return limits

    def planned(self, batch_id: int, plan: _Plan) -> Planned:
        """The rows a batch folded on the driver writes."""
        closed_touched: list[JobKey] = []
        if plan.fold.prunes:
            closed_touched = [key for key, state in plan.current.items() if state.part == CLOSED]
        skipped, first = plan.skipped()
        return Planned(
            events=t.arrow_rows(t.EVENTS, self.events_rows(batch_id, plan)),
            rejected=t.arrow_rows(t.REJECTED, self.rejected_rows(batch_id, plan)),
            stats=plan.fold.stats.rows,
            jobs_source=self.jobs_source(plan.fold),
            fence_after=plan.fence_after,
            archived=[archived_row(life) for life in plan.fold.archived],
            prunes=plan.fold.prunes,
            touched=plan.touched if plan.fold.prunes else set(),
            closed_touched=closed_touched,
            pauses=control_events(plan.logged, plan.admitted, is_pause_event),
            limits=control_events(plan.logged, plan.admitted, is_limit_event),
            events_count=len(plan.logged),
            skipped_records=skipped,
            first_reason=first,
            open_seqs=plan.open_seqs,
        )

    def _log_refusals(self, batch_id: int, planned: Planned) -> None:
        """One warning per batch that skips records (they are in `rejected`, with reasons)."""
        if planned.skipped_records:
            log.warning(
                "batch %d: %d events record(s) skipped in whole or part, see the rejected "
                "table (first: %s)",
                batch_id, planned.skipped_records, (planned.first_reason or "")[:300],
            )  # fmt: skip

    def _plan(self, rows: Sequence[KafkaRow]) -> _Plan:
        """Decode, fence and fold the batch (no writes)."""
        positions = self.positions()
        by_topic: dict[str, list[KafkaRow]] = {topic: [] for topic in self.topics.all()}
        for row in rows:
            by_topic.setdefault(row.topic, []).append(row)
        fold_rows = unseen(by_topic[self.topics.events], positions.tables[t.JOBS])
        decoded, undecodable = decode_events(fold_rows)
        logged, screened = screen_events(decoded)
        admitted, fence_after = fence_batch(logged, positions.fence)
        touched = touched_jobs(logged, admitted)
        mark = time.perf_counter()
        current, unreadable, open_seqs = self._current_jobs(
            touched, include_closed=bool(prune_groups(logged, admitted))
        )
        read_s = time.perf_counter() - mark
        stats_from = positions.tables[t.STATS_PARTIAL].get(self.topics.events, {})
        fold = fold_batch(
            logged,
            admitted,
            current,
            count_stats=lambda event: event.offset >= stats_from.get(event.partition, 0),
            unreadable=unreadable,
        )
        return _Plan(
            by_topic=by_topic,
            fold_rows=fold_rows,
            logged=logged,
            admitted=admitted,
            undecodable=undecodable,
            screened=screened,
            fence_after=fence_after,
            touched=touched,
            current=current,
            fold=fold,
            read_s=read_s,
            open_seqs=open_seqs,
        )

    # --- reading the touched jobs -------------------------------------------------------------

    def _current_jobs(
        self, keys: set[JobKey], *, include_closed: bool
    ) -> tuple[dict[JobKey, JobState], dict[JobKey, str], list[int | None]]:
        """The touched jobs' rows: the open partition (only open jobs can change), plus the
        closed one in a batch with `pruned` events (a pruned id may be submitted again); the
        touched jobs whose row does not read back as a record, with why (a row an older
        fold wrote unchecked: the batch refuses their events rather than stop); and the `seq`
        of the touched jobs' open rows as stored, for the MERGE's file skipping."""
        if not keys:
            return {}, {}, []
        table = self.commits.table(t.JOBS)
        ids = pa.array(sorted({job_id for _, job_id in keys}), pa.string())
        if self.cache_open_jobs:
            open_rows = self._open_jobs(table).rows(keys)
        else:
            open_rows = _read_partition(table, OPEN, ids)
        found = [open_rows]
        if include_closed:
            found.append(_read_partition(table, CLOSED, ids))
        rows = pa.concat_tables(found)
        current: dict[JobKey, JobState] = {}
        unreadable: dict[JobKey, str] = {}
        for row in rows.to_pylist():
            try:
                key, state = job_state(row)
            except RECORD_ERRORS as error:
                key = (str(row.get("dispatch_group")), str(row.get("id")))
                if key in keys:
                    unreadable[key] = f"{type(error).__name__}: {error}"[:500]
                    log.error("the jobs row of %s does not read back: %r", key, error)
                continue
            if key in keys:
                if key in current:
                    raise RuntimeError(f"jobs holds job {key} twice")
                current[key] = state
        touched_open = [
            (group, job_id) in keys
            for group, job_id in zip(
                open_rows["dispatch_group"].to_pylist(), open_rows["id"].to_pylist(), strict=True
            )
        ]
        open_seqs: list[int | None] = (
            open_rows["seq"].filter(pa.array(touched_open, pa.bool_())).to_pylist()
        )
        return current, unreadable, open_seqs

    def _open_jobs(self, table: DeltaTable) -> OpenJobs:
        """The cached open partition, valid at `table`'s version: loaded the first time, and
        again whenever a commit it did not follow may have changed the open rows."""
        version = table.version()
        cached = self._open
        if cached is not None and not self._keeps_open_rows(table, cached.version, version):
            log.info(
                "jobs moved from version %d to %d by commits this writer did not make: "
                "reading its open partition again", cached.version, version,
            )  # fmt: skip
            cached = None
        if cached is None:
            started = time.perf_counter()
            cached = OpenJobs.load(table)
            self.open_jobs_loads += 1
            log.info(
                "open partition of jobs (version %d) read: %d jobs, %.0f MB of rows in %.2fs",
                version, len(cached), cached.nbytes / 2**20, time.perf_counter() - started,
            )  # fmt: skip
        cached.version = version
        self._open = cached
        return cached

    def _keeps_open_rows(self, table: DeltaTable, since: int, until: int) -> bool:
        """Whether the `jobs` commits after version `since` up to `until` leave the open rows
        as they were: compaction, VACUUM, or this query's own prune MERGE (it deletes closed
        rows only). Anything else — another writer, a restart's commits — may not."""
        if until < since:
            return False
        if until == since:
            return True
        for commit in table.history(table.version() - since):
            if not since < commit["version"] <= until:
                continue
            if commit.get("operation") in _KEEPS_ROWS:
                continue
            progress = Progress.from_json(commit.get("userMetadata"))
            if progress is not None and progress.kind == PRUNE and progress.app_id == self.app_id:
                continue
            return False
        return True

    def _follow_merge(self, source: pa.Table, version: int | None) -> None:
        """Bring the cached open partition to the `jobs` MERGE just committed (`version`) of
        `source`, if nothing else changed the open rows since the cache's version."""
        cached = self._open
        if cached is None or version is None:
            return
        table = self.commits.table(t.JOBS)
        if self._keeps_open_rows(table, cached.version, version - 1):
            cached.apply(source, version)
        else:
            self._open = None

    # --- writes ---------------------------------------------------------------------------------

    def _append(self, name: str, rows: pa.Table, batch_id: int, progress: Progress) -> None:
        self.commits.append(
            name, rows, app_id=self.app_id, version=batch_id, metadata=progress.to_json()
        )

    def events_rows(self, batch_id: int, plan: _Plan) -> list[dict[str, Any]]:
        """The batch's `events` rows the table has not absorbed yet. An event the fold
        refused keeps its row, with the reason in `error`; one whose values no column holds
        gets a `refused` row (place, type, reason, JSON)."""
        mark = self.positions().tables[t.EVENTS]
        events_topic = self.topics.events
        absorbed = mark.get(events_topic, {})
        record_of = {(row.partition, row.offset): row for row in plan.fold_rows}
        why = {place(refused.logged): refused.reason for refused in plan.fold.refused}
        rows: list[dict[str, Any]] = []
        for event, ok in zip(plan.logged, plan.admitted, strict=True):
            if event.offset >= absorbed.get(event.partition, 0):
                record = record_of[(event.partition, event.offset)]
                bronze = event_bronze_row(event, record, ok, batch_id)
                bronze["error"] = why.get(place(event))
                rows.append(bronze)
        for refused in plan.screened:
            if refused.logged.offset >= absorbed.get(refused.logged.partition, 0):
                record = record_of[(refused.logged.partition, refused.logged.offset)]
                rows.append(refused_bronze_row(refused, record, batch_id))
        for bad in plan.undecodable:
            if bad.row.offset >= absorbed.get(bad.row.partition, 0):
                rows.append(undecodable_bronze_row(bad, batch_id))
        for row in unseen(plan.by_topic[self.topics.submit], mark):
            rows.append(submit_bronze_row(row, batch_id))
        for row in unseen(plan.by_topic[self.topics.rejected], mark):
            rows.append(rejected_bronze_row(row, batch_id))
        return rows

    def rejected_rows(self, batch_id: int, plan: _Plan) -> list[dict[str, Any]]:
        """The batch's `rejected` rows the table has not absorbed yet: one per rejection
        record, and one per events record the fold did not take whole (undecodable, or with
        refused events, named with their reasons)."""
        mark = self.positions().tables[t.REJECTED]
        rows = [
            rejected_row(row, batch_id) for row in unseen(plan.by_topic[self.topics.rejected], mark)
        ]
        absorbed = mark.get(self.topics.events, {})
        record_of = {(row.partition, row.offset): row for row in plan.fold_rows}
        for bad in plan.undecodable:
            if bad.row.offset >= absorbed.get(bad.row.partition, 0):
                rows.append(refused_record_row(bad.row, [bad.reason], None, batch_id))
        for (partition, offset), refusals in plan.refusals().items():
            if offset >= absorbed.get(partition, 0):
                event = refusals[0].logged.event
                job_id = event.job_id if isinstance(event, JobEvent) else None
                rows.append(
                    refused_record_row(
                        record_of[(partition, offset)],
                        [refusal_reason(refused) for refused in refusals],
                        job_id if job_id is None or guard.utf8(job_id) else None,
                        batch_id,
                    )
                )
        return rows

    def _write_stats_partial(
        self, batch_id: int, end: Offsets, contributions: Mapping[StatsKey, MinuteStats]
    ) -> None:
        """The batch's statistics as partial rows (rolled up into `stats` later)."""
        rows = self.stats_partial_rows(batch_id, end, contributions)
        if not rows:
            return
        table = t.arrow_rows(t.STATS_PARTIAL, rows)  # percentile columns are left out
        self._append(t.STATS_PARTIAL, table, batch_id, self._progress(batch_id, end))

    def stats_partial_rows(
        self, batch_id: int, end: Offsets, contributions: Mapping[StatsKey, MinuteStats]
    ) -> list[dict[str, Any]]:
        batch_end = sum(end.get(self.topics.events, {}).values())
        rows = []
        for key in sorted(contributions):
            row = stats_row(key, contributions[key])
            row.update(batch_end=batch_end, batch_id=batch_id)
            rows.append(row)
        return rows

    def _write_prunes(
        self, spark: SparkSession, batch_id: int, end: Offsets, planned: Planned
    ) -> None:
        """Move the jobs the leader pruned from `jobs` to `jobs_archive`: the touched ones as
        folded, the untouched closed ones by the prunes' rule (`updated_at <= before`)."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        touched = planned.touched
        jobs_path = self.warehouse.table(t.JOBS)
        touched_frame = spark.createDataFrame(
            pa.table(
                {
                    "dispatch_group": pa.array([group for group, _ in touched], pa.string()),
                    "id": pa.array([job_id for _, job_id in touched], pa.string()),
                }
            )
        )
        untouched: DataFrame | None = None
        for group, steps in planned.prunes.items():
            latest = max(step.before for step in steps)
            archived_at = F.lit(None).cast("double")
            for step in reversed(steps):
                # The first prune (in log order) whose `before` covers the row archives it.
                archived_at = F.when(F.col("updated_at") <= F.lit(step.before), step.at).otherwise(
                    archived_at
                )
            selected = (
                spark.read.format("delta")
                .load(jobs_path)
                .where(
                    (F.col("part") == CLOSED)
                    & (F.col("dispatch_group") == group)
                    & (F.col("updated_at") <= F.lit(latest))
                )
                .join(touched_frame, ["dispatch_group", "id"], "left_anti")
                .withColumn("archived_at", archived_at)
            )
            untouched = selected if untouched is None else untouched.unionByName(selected)
        assert untouched is not None

        archive_columns = t.SCHEMAS[t.JOBS_ARCHIVE].names
        touched_lives = spark.createDataFrame(t.arrow_rows(t.JOBS_ARCHIVE, planned.archived))
        archive = (
            untouched.withColumn("date", F.to_date(F.timestamp_seconds(F.col("updated_at"))))
            .select(*archive_columns)
            .unionByName(touched_lives.select(*archive_columns))
        )
        archive_mark = self.positions().tables[t.JOBS_ARCHIVE].get(self.topics.events, {})
        if any(
            offset > archive_mark.get(partition, 0)
            for partition, offset in end.get(self.topics.events, {}).items()
        ):
            (
                archive.write.format("delta")
                .mode("append")
                .option("txnAppId", self.app_id)
                .option("txnVersion", str(batch_id))
                .option("userMetadata", self._progress(batch_id, end).to_json())
                .save(self.warehouse.table(t.JOBS_ARCHIVE))
            )

        # Pruned closed rows, and the closed rows of touched jobs (their new life is MERGEd
        # next; only the batch's prunes let a closed job be touched at all).
        closed_touched = planned.closed_touched
        doomed = untouched.select("dispatch_group", "id").unionByName(
            spark.createDataFrame(
                pa.table(
                    {
                        "dispatch_group": pa.array([g for g, _ in closed_touched], pa.string()),
                        "id": pa.array([i for _, i in closed_touched], pa.string()),
                    }
                )
            )
        )
        target = DeltaTable.forPath(spark, jobs_path)
        progress = self._progress(batch_id, end, kind=PRUNE)
        with spark_writes.keyed_on_batch(
            spark, self.app_id + "-prune", batch_id, progress.to_json()
        ):
            (
                target.alias("t")
                .merge(
                    doomed.alias("s"),
                    f"t.part = '{CLOSED}' AND t.dispatch_group = s.dispatch_group AND t.id = s.id",
                )
                .whenMatchedDelete()
                .execute()
            )

    def _merge_jobs(
        self,
        batch_id: int,
        end: Offsets,
        source: pa.Table,
        open_seqs: list[int | None] | None = None,
    ) -> None:
        """The batch's last commit: upsert the folded jobs, delete the pruned ones, and record
        the batch's progress. Made even when no job changed (a batch of heartbeats or submit
        records only: `DeltaCommits.merge` then commits the progress with no data), so the
        snapshot pointer, the fence epochs and the lag always move with the log.

        `open_seqs`, when the fold knows them (on the driver): the `seq` of every touched
        job's row in the open partition, as stored. The MERGE then scans only the files whose
        `seq` statistics may hold one of those rows, not the whole backlog of queued jobs; a
        touched job with no row among them has none in the open partition, so no match is
        lost in the files skipped."""
        version = self.commits.merge(
            t.JOBS,
            source,
            _jobs_merge_predicate("" if open_seqs is None else narrowing("t.seq", open_seqs)),
            lambda merge: (
                merge.when_matched_delete(predicate="s._delete")
                .when_matched_update(updates=_JOBS_MERGE_COLUMNS)
                .when_not_matched_insert(updates=_JOBS_MERGE_COLUMNS, predicate="NOT s._delete")
            ),
            app_id=self.app_id,
            version=batch_id,
            metadata=self._progress(batch_id, end).to_json(),
        )
        self._follow_merge(source, version)

    def _spark_merge_jobs(
        self, spark: SparkSession, batch_id: int, end: Offsets, rows: ExecutorRows
    ) -> None:
        """`_merge_jobs` for a source that stayed on the executors: Spark's MERGE, then the
        progress alone if that MERGE made no commit (nothing to write, or the batch's commit
        was in the table already), so the batch's progress always lands.

        Narrowed like the driver's MERGE, by the `seq` ranges of the touched jobs' open rows
        the fold read, when nothing but row-keeping commits came after the version read (else
        a row could have moved to a file the ranges skip)."""
        table = self.commits.table(t.JOBS)
        narrowed = ""
        if self._keeps_open_rows(table, rows.jobs_version, table.version()):
            narrowed = ranges_condition("t.seq", rows.open_seqs, with_null=rows.open_seq_null)
        metadata = self._progress(batch_id, end).to_json()
        spark_writes.merge_jobs(
            spark,
            rows.jobs,
            self.warehouse.table(t.JOBS),
            _jobs_merge_predicate(narrowed),
            _JOBS_MERGE_COLUMNS,
            app_id=self.app_id,
            version=batch_id,
            metadata=metadata,
        )
        self.commits.commit_progress(
            t.JOBS, app_id=self.app_id, version=batch_id, metadata=metadata
        )

    @staticmethod
    def jobs_source(fold: BatchFold) -> pa.Table:
        """The `jobs` MERGE's source: a row per touched job (`_delete`: pruned, gone)."""
        rows: list[dict[str, Any]] = []
        for (group, job_id), state in fold.final.items():
            if state is None:
                row: dict[str, Any] = dict.fromkeys(_JOB_COLUMNS)
                row.update(dispatch_group=group, id=job_id, part=OPEN, _delete=True)
            else:
                row = job_row(group, state)
                row["_delete"] = False
            rows.append(row)
        return pa.Table.from_pylist(rows, schema=JOBS_SOURCE)

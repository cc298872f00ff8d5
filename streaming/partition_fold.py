"""The fold as functions of one Spark partition, for `mapInArrow` on executors.

Two stages, each an iterator of Arrow record batches in and out, with no Spark import, so the
unit tests run them without a JVM and Spark runs them unchanged:

1. `explode_records`: `dispatch.events` records -> one `events` (bronze) row per logged event,
   per event set aside by `screen_events`, and per undecodable record, exactly the rows the
   driver's fold writes (`admitted` is left NULL: the fence is batch-wide, and the driver knows
   it from the batch's few `leader_elected` events alone); `explode_other_records`: the submit
   and rejected topics' records -> their `events` rows.
2. `fold_partition`: a partition of the batch repartitioned by job, holding each touched job's
   current `jobs` row (`row`) and its admitted events (`body`, as stage 1 wrote it) -> the
   jobs' new rows, the lives pruned during the batch, the events refused, and the partition's
   statistics. It calls `dispatch.streaming.fold.fold_batch`, the one fold function, so the leader,
   the driver and the executors cannot disagree; a job's result depends only on its own events
   and its group's `pruned` events, which every partition is given (`PruneEvent`).

Why one Python call per partition and not per job: docs/streaming.md, "Where the fold should
run" (per-group operators cost many times the reducer itself: BENCHMARKS.md, *Where the
fold could run*).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from dispatch.core.events import Pruned, event_from_dict
from dispatch.delta import tables as t
from dispatch.delta.job_rows import OPEN, JobKey, JobState, job_row, job_state
from dispatch.streaming.decode import (
    RECORD_ERRORS,
    KafkaRow,
    LoggedEvent,
    decode_events,
    event_bronze_row,
    kafka_rows,
    refused_bronze_row,
    rejected_bronze_row,
    screen_events,
    submit_bronze_row,
    undecodable_bronze_row,
)
from dispatch.streaming.fold import PruneStep, archived_row, fold_batch
from dispatch.streaming.open_jobs import value_ranges
from dispatch.streaming.planned import JOBS_SOURCE
from dispatch.streaming.rollup import stats_row

EVENT_KIND = "event"
"""`events.kind` of a decoded event (the others: `refused`, `undecodable`)."""

KAFKA_COLUMNS = ("topic", "partition", "offset", "key", "value", "timestamp")
"""Stage 1's input: the Kafka source's columns, `timestamp` as microseconds since the epoch
(a producer-set time past year 9999 must not fail the conversion for the whole batch)."""

JOB_ROW = pa.struct(list(JOBS_SOURCE))
"""A `jobs` MERGE source row, as a struct (`dispatch.streaming.planned.JOBS_SOURCE`)."""
_JOB_ROW_NAMES: list[str] = [field.name for field in JOB_ROW]

FOLD_INPUT = pa.schema(
    [
        ("dispatch_group", pa.string()),
        ("job_id", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("idx", pa.int32()),
        ("record_epoch", pa.int64()),
        ("body", pa.string()),
        ("row", pa.struct(list(t.SCHEMAS[t.JOBS]))),
    ]
)
"""Stage 2's input: an admitted job event (`body` set, `row` NULL) or a touched job's current
`jobs` row (`row` set, `body` NULL)."""

KIND_JOB, KIND_ARCHIVED, KIND_REFUSED, KIND_STATS = "job", "archived", "refused", "stats"
KIND_OPEN_SEQS = "open_seqs"
SEQ_RANGES = 16
"""At most this many `open_seqs` ranges per partition (the MERGE's condition joins them)."""

FOLD_OUTPUT = pa.schema(
    [
        ("kind", pa.string()),
        ("job", JOB_ROW),
        ("archived", pa.struct(list(t.SCHEMAS[t.JOBS_ARCHIVE]))),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("idx", pa.int32()),
        ("reason", pa.string()),
        ("stats", pa.struct(list(t.SCHEMAS[t.STATS_PARTIAL]))),
        ("seq_low", pa.int64()),
        ("seq_high", pa.int64()),
    ]
)
"""Stage 2's output, one row per thing the batch writes, by `kind`: `job` (a MERGE source
row), `archived` (a `jobs_archive` row), `refused` (the place of an event that does not fit its
job, and why), `stats` (a `stats_partial` row without `batch_end`/`batch_id`), `open_seqs` (a
range `seq_low`..`seq_high` of the `seq` the partition's touched jobs have in the open
partition of `jobs` as stored, both NULL for a stored NULL: the `jobs` MERGE scans only the
files that may hold them, see `BatchWriter._spark_merge_jobs`)."""


# --- stage 1 -----------------------------------------------------------------------------------


def explode_records(batches: Iterable[pa.RecordBatch], batch_id: int) -> Iterator[pa.RecordBatch]:
    """Events records -> their `events` rows (see the module's docstring)."""
    for batch in batches:
        rows = kafka_rows(batch.to_pydict())
        if rows:
            yield from t.arrow_rows(t.EVENTS, exploded_rows(rows, batch_id)).to_batches()


def exploded_rows(rows: Sequence[KafkaRow], batch_id: int) -> list[dict[str, Any]]:
    """The `events` rows of some events records, `admitted` NULL."""
    record_of = {(row.partition, row.offset): row for row in rows}
    decoded, undecodable = decode_events(rows)
    logged, screened = screen_events(decoded)
    out: list[dict[str, Any]] = []
    for event in logged:
        bronze = event_bronze_row(event, record_of[(event.partition, event.offset)], True, batch_id)
        bronze["admitted"] = None
        out.append(bronze)
    for refused in screened:
        record = record_of[(refused.logged.partition, refused.logged.offset)]
        out.append(refused_bronze_row(refused, record, batch_id))
    out.extend(undecodable_bronze_row(bad, batch_id) for bad in undecodable)
    return out


def explode_other_records(
    batches: Iterable[pa.RecordBatch], batch_id: int, submit_topic: str
) -> Iterator[pa.RecordBatch]:
    """Records of the submit and rejected topics -> their `events` (bronze) rows."""
    for batch in batches:
        rows = kafka_rows(batch.to_pydict())
        bronze = [
            submit_bronze_row(row, batch_id)
            if row.topic == submit_topic
            else rejected_bronze_row(row, batch_id)
            for row in rows
        ]
        if bronze:
            yield from t.arrow_rows(t.EVENTS, bronze).to_batches()


def logged_event(row: Mapping[str, Any]) -> LoggedEvent:
    """An `events` row of kind `event` back as the logged event it was made from (its `body`
    is the event's own `to_dict()` JSON, parsed by the core's validating constructor)."""
    return LoggedEvent(
        partition=int(row["partition"]),
        offset=int(row["offset"]),
        index=int(row["idx"]),
        group=str(row["dispatch_group"]),
        record_epoch=int(row["record_epoch"]),
        event=event_from_dict(json.loads(row["body"])),
    )


# --- stage 2 -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PruneEvent:
    """An admitted `pruned` event of the batch, given to every partition: a job's walk applies
    its group's prunes at their place in the log."""

    partition: int
    offset: int
    idx: int
    group: str
    record_epoch: int
    body: str

    def logged(self) -> LoggedEvent:
        return logged_event(
            {
                "partition": self.partition, "offset": self.offset, "idx": self.idx,
                "dispatch_group": self.group, "record_epoch": self.record_epoch,
                "body": self.body,
            }
        )  # fmt: skip


def prune_steps(prunes: Sequence[PruneEvent]) -> dict[str, list[PruneStep]]:
    """Per group, the batch's prunes in log order: the driver applies them to the closed jobs
    the batch does not touch (`BatchFold.prunes` of the driver's fold)."""
    steps: dict[str, list[PruneStep]] = {}
    for prune in sorted(prunes, key=operator.attrgetter("partition", "offset", "idx")):
        event = prune.logged().event
        if not isinstance(event, Pruned):
            raise ValueError(f"not a pruned event at {prune.partition}:{prune.offset}")
        steps.setdefault(prune.group, []).append(PruneStep(event.at, event.before))
    return steps


def fold_partition(
    batches: Iterable[pa.RecordBatch],
    prunes: Sequence[PruneEvent],
    stats_from: Mapping[int, int],
) -> Iterator[pa.RecordBatch]:
    """One partition's jobs folded (see the module's docstring). `stats_from`: per events
    partition, the first offset `stats_partial` has not counted yet."""
    events: list[LoggedEvent] = [prune.logged() for prune in prunes]
    for prune in events:
        if not isinstance(prune.event, Pruned):
            raise ValueError(f"not a pruned event at {prune.partition}:{prune.offset}")
    current: dict[JobKey, JobState] = {}
    unreadable: dict[JobKey, str] = {}
    open_seqs: list[int | None] = []
    for batch in batches:
        for item in batch.to_pylist():
            if item["body"] is not None:
                events.append(logged_event(item))
            elif item["row"] is not None:
                _read_row(item["row"], current, unreadable)
                if item["row"]["part"] == OPEN:
                    open_seqs.append(item["row"]["seq"])
    if not events and not current:
        return
    events.sort(key=operator.attrgetter("partition", "offset", "index"))
    fold = fold_batch(
        events,
        [True] * len(events),
        current,
        count_stats=_counted_from(stats_from),
        unreadable=unreadable,
    )
    out: list[dict[str, Any]] = []
    for (group, job_id), state in fold.final.items():
        if state is None:
            job: dict[str, Any] = dict.fromkeys(_JOB_ROW_NAMES)
            job.update(dispatch_group=group, id=job_id, part="open", _delete=True)
        else:
            job = job_row(group, state)
            job["_delete"] = False
        out.append({"kind": KIND_JOB, "job": job})
    for life in fold.archived:
        out.append({"kind": KIND_ARCHIVED, "archived": archived_row(life)})
    for refused in fold.refused:
        place = refused.logged
        out.append(
            {
                "kind": KIND_REFUSED, "partition": place.partition, "offset": place.offset,
                "idx": place.index, "reason": refused.reason,
            }
        )  # fmt: skip
    for key in sorted(fold.stats.rows):
        out.append({"kind": KIND_STATS, "stats": stats_row(key, fold.stats.rows[key])})
    stored = [seq for seq in open_seqs if seq is not None]
    for low, high in value_ranges(stored, SEQ_RANGES):
        out.append({"kind": KIND_OPEN_SEQS, "seq_low": low, "seq_high": high})
    if len(stored) < len(open_seqs):
        out.append({"kind": KIND_OPEN_SEQS, "seq_low": None, "seq_high": None})
    yield from pa.Table.from_pylist(out, schema=FOLD_OUTPUT).to_batches()


def _read_row(
    row: Mapping[str, Any], current: dict[JobKey, JobState], unreadable: dict[JobKey, str]
) -> None:
    """A touched job's `jobs` row into `current`, or into `unreadable` with why (a row an
    older fold wrote unchecked: the batch refuses the job's events rather than stop)."""
    try:
        key, state = job_state(row)
    except RECORD_ERRORS as error:
        key = (str(row.get("dispatch_group")), str(row.get("id")))
        unreadable[key] = f"{type(error).__name__}: {error}"[:500]
        return
    if key in current:
        raise RuntimeError(f"jobs holds job {key} twice")
    current[key] = state


def _counted_from(stats_from: Mapping[int, int]) -> Callable[[LoggedEvent], bool]:
    return lambda event: event.offset >= stats_from.get(event.partition, 0)

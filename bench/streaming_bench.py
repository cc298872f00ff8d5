"""Streaming benchmark: freshness of the Delta tables, and a batch's cost against the history
and against the backlog of queued jobs.

    .venv/bin/python -m dispatch.bench.streaming_bench                    # freshness and MERGE cost
    .venv/bin/python -m dispatch.bench.streaming_bench --skip-merge --rate 1000 --duration 120
    .venv/bin/python -m dispatch.bench.streaming_bench --skip-freshness --history
    10000,100000,1000000 .venv/bin/python -m dispatch.bench.streaming_bench --skip-freshness
    --skip-merge --backlog 0,1000000

Everything runs on a temporary broker (free ports) and a temporary warehouse.

**Freshness.** A leader emulator (`bench/leader_emulator.py`, a process of its own, so it does
not share this process's GIL) runs the pure dispatcher core at `--rate` jobs/s: every 10 ms it
submits the jobs due by then (job i is due i / rate after its start, so a late tick catches
up), assigns them to workers and acks those assigned `--run-s` ago, and writes what that tick
decided to `dispatch.events` (one record, or several of at most 4 MiB each when the tick is
large, in order, without a transaction), plus one `dispatch.submit` record per job. Its core's
cap on jobs in flight per client (5 clients) is twice what `--rate` keeps in flight even with
ticks 30 s late, and every worker gets credit for the whole rate for as long, so neither limits
the rate: what it submits, it assigns and completes. The streaming application runs in this
process with its production options. Afterwards the events topic is read back: an event is
visible in `jobs` when the first `jobs` commit whose recorded offsets cover its record is
committed, so freshness = that commit's timestamp - the event's `at` (same clock).

The measured run (after `--warmup`) is cut into 10 s windows (`bench/freshness_windows.py`),
each with the jobs submitted (`enqueued`), assigned and completed per second, counted from the
events read back, the freshness of its events, the emulator's worst lag (how long after its due
time a job was submitted) and how long its records took to be acknowledged. The result states
the rate asked for and the rate measured (submitted/s over the run), and names every shortfall
and who could not keep up: the emulator, when submitted/s falls more than 5% below the rate
asked, assigned or completed/s more than 5% below submitted/s, or its lag or its records' wait
passes 1 s; the fold, when it needs more than 10 s after the emulator stopped to read the rest,
or its freshness grew over the run.

**MERGE cost.** For each history size H, a fresh `jobs` table gets H finished jobs (bulk
written, then compacted, as a long-running table would be) and a backlog of queued jobs; then
identical batches (N new jobs submitted, N jobs assigned and acked, so every batch inserts,
updates and moves rows) go through `BatchWriter` one by one, and the per-step times are
recorded. The first batch after the bulk load is a warm-up and is not counted.

**Backlog** (`--backlog`). For each backlog size B, a fresh `jobs` table gets
`--backlog-history` finished jobs and B jobs queued in the emulator's core, whose rows are bulk
written to the open partition (then compacted, as the maintenance would); job ids are random
uuid4 hex, as clients choose them. Then identical batches: each submits N jobs (queued behind
the backlog), assigns N from the head of the queues and acks the N assigned one batch earlier,
so whatever B, every batch inserts N open rows, updates N and moves N to the closed partition.
Reported per B: the batch's p50/p95 and its steps (the read of the touched jobs' current rows,
the rest of the fold, the `jobs` MERGE, the other commits, the collect), delta-rs's MERGE
metrics, and the process's memory.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from dispatch.bench.freshness_windows import (
    CATCH_UP_WAIT_S,
    COUNTED,
    SeenEvent,
    Window,
    add_emulator_lag,
    percentiles,
    shortfalls,
    windows_of,
)
from dispatch.bench.leader_emulator import EXECS, GROUP, Emulator, emulate_leader
from dispatch.bench.signals import unwinds_on_sigterm
from dispatch.core.events import Event
from dispatch.event_records import encode_batch
from dispatch.settings import Settings, load_settings
from dispatch.settings import with_namespace as namespace_settings
from dispatch.stack.broker import Broker, create_topics
from dispatch.stack.ports import free_port
from dispatch.storage import Location
from dispatch.warehouse import Warehouse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# --- infrastructure ----------------------------------------------------------------------------


@contextlib.contextmanager
def stack(scratch: Path) -> Iterator[Settings]:
    """A temporary broker on free ports, data under `scratch`."""
    settings = load_settings(
        paths={"var": str(scratch / "var"), "warehouse": str(scratch / "delta")},
        kafka={"bootstrap": f"127.0.0.1:{free_port()}", "controller_port": free_port()},
    )
    broker = Broker(settings)
    broker.start()
    try:
        yield settings
    finally:
        broker.stop()


@contextlib.contextmanager
def standalone_cluster(settings: Settings, workers: int, cores: int) -> Iterator[Settings]:
    """A Spark standalone master and `workers` workers of `cores` cores on loopback (the stack's
    own `SparkCluster`), and the settings that point the fold's session at it: `fold_on=auto`
    then folds on its executors, one per worker."""
    from dispatch.stack.spark_cluster import SparkCluster, on_loopback, running

    on_cluster = on_loopback(settings, workers=workers, worker_cores=cores, worker_memory="1536m")
    on_cluster = on_cluster.model_copy(
        update={"spark": on_cluster.spark.model_copy(update={"executor_memory": "1g"})}
    )
    with running(SparkCluster(on_cluster)):
        yield on_cluster


def with_namespace(settings: Settings, name: str, scratch: Path) -> Settings:
    """`dispatch.settings.with_namespace` under `scratch / name`, with the topics created."""
    namespaced = namespace_settings(settings, name, scratch / name)
    create_topics(namespaced.kafka)
    return namespaced


# --- freshness ---------------------------------------------------------------------------------


@dataclass
class FreshnessResult:
    fold_on: str
    """Where the query folded each batch (`StreamOptions.fold_on`)."""
    rate_asked: float
    rate_measured: float
    """Jobs submitted per second over the measured run, counted from the log."""
    assigned_per_s: float
    completed_per_s: float
    kept_up: bool
    shortfalls: list[str]
    duration_s: float
    warmup_s: float
    run_s: float
    jobs_submitted: int
    jobs_assigned: int
    jobs_completed: int
    freshness_s: dict[str, float]
    events_not_visible: int
    windows: list[Window]
    emulator: dict[str, Any]
    fold_catch_up_s: float | None
    """From the emulator's end until the fold had read everything; None: not within the wait."""
    batches: int
    batches_on_executors: int
    """Of `batches`, those folded on the executors (`auto` on a cluster folds a batch under
    `spark.executor_fold_min_records` on the driver)."""
    batch_s: dict[str, float]
    steps_median_s: dict[str, float]
    records_per_batch_median: float
    rollup_runs: int
    rollup_s: dict[str, float]
    maintenance_runs: int
    maintenance_s: dict[str, float]


def commits_of(warehouse: Warehouse, events_topic: str) -> list[tuple[float, dict[int, int]]]:
    """(commit time, events offsets covered) of every batch commit of `jobs`, oldest first."""
    from dispatch.delta import tables as t
    from dispatch.delta.progress import BATCH, Progress

    out = []
    for commit in warehouse.open(t.JOBS).history():
        progress = Progress.from_json(commit.get("userMetadata"))
        if progress is not None and progress.kind == BATCH:
            out.append((commit["timestamp"] / 1000.0, progress.offsets.get(events_topic, {})))
    out.sort(key=lambda item: item[0])
    return out


def read_events(settings: Settings) -> list[tuple[int, int, list[tuple[str, float]]]]:
    """(partition, offset, [(type, at) of each job event]) of every events record."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap, group_id=None, enable_auto_commit=False
    )
    topic = settings.kafka.events_topic
    partitions = [
        TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())
    ]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    end = consumer.end_offsets(partitions)
    out = []
    while any(consumer.position(p) < end[p] for p in partitions):
        for batch in consumer.poll(timeout_ms=500).values():
            for record in batch:
                # The emulator's own records: plain JSON suffices (decode_batch's checks
                # would double the read-back of a long run).
                events = orjson.loads(record.value)["events"]
                jobs = [(e["type"], e["at"]) for e in events if "job_id" in e]
                out.append((record.partition, record.offset, jobs))
    consumer.close()
    return out


def seen_events(
    records: Iterable[tuple[int, int, list[tuple[str, float]]]],
    commits: Sequence[tuple[float, dict[int, int]]],
) -> list[SeenEvent]:
    """Every job event with the time of the first `jobs` commit covering its record."""
    out: list[SeenEvent] = []
    position, current = 0, None
    for partition, offset, events in sorted(records, key=lambda item: (item[0], item[1])):
        if partition != current:
            position, current = 0, partition
        while position < len(commits) and commits[position][1].get(partition, 0) <= offset:
            position += 1
        visible = commits[position][0] if position < len(commits) else None
        out.extend((kind, at, visible) for kind, at in events)
    return out


def freshness(
    spark: SparkSession,
    settings: Settings,
    rate: float,
    duration_s: float,
    warmup_s: float,
    optimize_every_s: float,
    run_s: float = 1.0,
    fold_on: str = "auto",
) -> FreshnessResult:
    from dispatch.delta.lag import streaming_lag
    from dispatch.streaming.app import StreamOptions, fold_place, start
    from dispatch.streaming.maintenance import MaintenancePolicy

    settings = with_namespace(settings, f"fresh-{int(rate)}", settings.paths.var.parent)
    kafka = settings.kafka
    stats_path = settings.paths.var / "leader-emulator.json"
    stats_path.parent.mkdir(parents=True, exist_ok=True)
    leader = multiprocessing.get_context("spawn").Process(
        target=emulate_leader,
        args=(
            kafka.bootstrap,
            kafka.submit_topic,
            kafka.events_topic,
            rate,
            run_s,
            duration_s + warmup_s,
            str(stats_path),
        ),
        daemon=True,
    )
    options = StreamOptions(
        maintenance=MaintenancePolicy(optimize_every_s=optimize_every_s), fold_on=fold_on
    )
    query, writer = start(settings, spark, options=options)
    leader.start()
    leader.join(warmup_s)
    warm_batches = max((h.batch_id for h in writer.history), default=-1)
    leader.join(duration_s + 120)
    stopped = time.monotonic()
    caught_up: float | None = None
    while time.monotonic() < stopped + CATCH_UP_WAIT_S:
        if not any(streaming_lag(settings).values()):
            caught_up = round(time.monotonic() - stopped, 1)
            break
        time.sleep(1.0)
    query.stop()
    if leader.exitcode != 0 or not stats_path.exists():
        raise RuntimeError(f"the leader emulator failed (exit code {leader.exitcode})")
    stats = json.loads(stats_path.read_text())
    measured_from = stats["started"] + warmup_s
    measured_to = stats["started"] + warmup_s + duration_s
    seen = seen_events(
        read_events(settings), commits_of(Warehouse.of(settings), kafka.events_topic)
    )
    windows = windows_of(seen, measured_from, measured_to)
    add_emulator_lag(windows, stats["ticks"], stats["written"], measured_from)
    totals = Counter[str]()
    for window in windows:
        totals.update(window.jobs)
    per_s = {name: round(totals[name] / duration_s, 1) for name in COUNTED.values()}
    in_run = [tick for tick in stats["ticks"] if measured_from <= tick[0] < measured_to]
    emulator = {
        "cap_per_client": stats["cap_per_client"],
        "credit_per_worker": stats["credit_per_worker"],
        "lag_s": percentiles([tick[1] for tick in in_run]),
        "busy_fraction": round(sum(tick[2] for tick in in_run) / duration_s, 3),
        "write_s": percentiles(
            [w[1] for w in stats["written"] if measured_from <= w[0] < measured_to]
        ),
    }
    problems = shortfalls(
        rate,
        per_s["submitted"],
        per_s["assigned"],
        per_s["completed"],
        windows,
        emulator["lag_s"].get("max", 0.0),
        emulator["write_s"].get("p95", 0.0),
        caught_up,
    )
    history = [h for h in writer.history if h.total_s > 0 and h.batch_id > warm_batches]
    steps = (
        "collect_s",
        "fold_s",
        "events_write_s",
        "stats_write_s",
        "prune_s",
        "jobs_merge_s",
        "maintenance_s",
    )
    return FreshnessResult(
        fold_on=fold_place(fold_on, settings.spark.master),
        rate_asked=rate,
        rate_measured=per_s["submitted"],
        assigned_per_s=per_s["assigned"],
        completed_per_s=per_s["completed"],
        kept_up=not problems,
        shortfalls=problems,
        duration_s=duration_s,
        warmup_s=warmup_s,
        run_s=run_s,
        jobs_submitted=totals["submitted"],
        jobs_assigned=totals["assigned"],
        jobs_completed=totals["completed"],
        freshness_s=percentiles(
            [v - at for _, at, v in seen if v is not None and measured_from <= at < measured_to]
        ),
        events_not_visible=sum(w.not_visible for w in windows),
        windows=windows,
        emulator=emulator,
        fold_catch_up_s=caught_up,
        batches=len(history),
        batches_on_executors=sum(1 for h in history if h.on_executors),
        batch_s=percentiles([h.total_s for h in history]),
        steps_median_s={
            step: round(statistics.median(getattr(h, step) for h in history), 3)
            for step in steps
            if history
        },
        records_per_batch_median=statistics.median(h.records for h in history) if history else 0,
        rollup_runs=sum(1 for h in history if h.rollup_s > 0),
        rollup_s=percentiles([h.rollup_s for h in history if h.rollup_s > 0]),
        maintenance_runs=sum(1 for h in history if h.maintenance_steps),
        maintenance_s=percentiles([h.maintenance_s for h in history if h.maintenance_steps]),
    )


def describe(result: FreshnessResult) -> str:
    """The freshness result for a reader: the rates, a line per window, the verdict."""
    r, f, e = result, result.freshness_s, result.emulator
    head = ("window", "subm/s", "assig/s", "compl/s", "p50", "p95", "p99", "max", "unseen")
    lines = [
        f"freshness run (fold on {r.fold_on}): {r.rate_asked:,.0f} jobs/s asked; measured "
        f"{r.rate_measured:,.1f} submitted/s, {r.assigned_per_s:,.1f} assigned/s, "
        f"{r.completed_per_s:,.1f} completed/s "
        f"over {r.duration_s:g} s after {r.warmup_s:g} s of warm-up (jobs run {r.run_s:g} s)",
        " ".join(f"{name:>8}" for name in head) + "  emu lag  write p95",
    ]
    for w in r.windows:
        cells = [f"{w.start_s:>6g} s"]
        cells += [f"{v:>8,.1f}" for v in (w.submitted_per_s, w.assigned_per_s, w.completed_per_s)]
        cells += [f"{w.freshness_s.get(k, math.nan):>8.2f}" for k in ("p50", "p95", "p99", "max")]
        cells += [f"{w.not_visible:>8}", f"{w.emulator_lag_max_s:>8.3f}", f"{w.write_p95_s:>10.3f}"]
        lines.append(" ".join(cells))
    caught_up = (
        f"{r.fold_catch_up_s:g} s after the emulator stopped"
        if r.fold_catch_up_s is not None
        else f"NOT within {CATCH_UP_WAIT_S:.0f} s"
    )
    lines += [
        f"freshness p50 / p95 / p99 / max: {f.get('p50')} / {f.get('p95')} / {f.get('p99')} / "
        f"{f.get('max')} s over {f.get('n', 0):,} events ({r.events_not_visible} never visible)",
        f"emulator: cap {e['cap_per_client']:,}/client, credit {e['credit_per_worker']:,}/worker,"
        f" busy {e['busy_fraction']:.0%}, lag p95 {e['lag_s'].get('p95')} s, max "
        f"{e['lag_s'].get('max')} s; events records acknowledged p95 {e['write_s'].get('p95')} s",
        f"fold: {r.batches} batches ({r.batches_on_executors} on the executors), p50 "
        f"{r.batch_s.get('p50')} s, p95 {r.batch_s.get('p95')} s, "
        f"median {r.records_per_batch_median:g} records; caught up {caught_up}",
        "kept up: yes" if r.kept_up else "kept up: NO\n  " + "\n  ".join(r.shortfalls),
    ]
    return "\n".join(lines)


# --- MERGE cost against history -----------------------------------------------------------------


def _median_metric(metrics: list[dict[str, Any]], name: str) -> float:
    """The median of one operation metric over commits (0 when none has it)."""
    values = [float(m[name]) for m in metrics if name in m]
    return statistics.median(values) if values else 0.0


@dataclass
class MergeResult:
    history: int
    batch_jobs: int
    batches: int
    jobs_merge_s: dict[str, float]
    batch_total_s: dict[str, float]
    stats_write_s: dict[str, float]
    merge_files_scanned_median: float
    merge_files_skipped_median: float
    merge_files_removed_median: float
    merge_scan_ms_median: float
    history_load_s: float
    snapshot_load_s: float
    snapshot_jobs: int
    extra: dict[str, Any] = field(default_factory=dict)


def bulk_history(spark: SparkSession, warehouse: Warehouse, count: int) -> None:
    """`count` succeeded jobs in the closed partition, then compacted."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from dispatch.delta import tables as t

    schema = t.spark_schema(t.JOBS)
    base = 1_700_000_000.0
    expressions = {
        "dispatch_group": F.lit(GROUP),
        "id": F.concat(F.lit("hist-"), F.col("id").cast("string")),
        "client_id": F.concat(F.lit("client-"), (F.col("id") % 5).cast("string")),
        "exec": F.element_at(
            F.array(*[F.lit(e) for e in EXECS]), (F.col("id") % len(EXECS) + 1).cast("int")
        ),
        "status": F.lit("succeeded"),
        "attempts": F.lit(1),
        "worker_id": F.lit("w0"),
        "submitted_at": F.lit(base) + F.col("id") * 0.001,
        "updated_at": F.lit(base + 2.0) + F.col("id") * 0.001,
        "result": F.lit('{"ok":true}'),
        "error": F.lit(None),
        "payload": F.concat(F.lit('{"n":'), F.col("id").cast("string"), F.lit("}")),
        "max_attempts": F.lit(5),
        "timeout_s": F.lit(30.0),
        "priority": F.lit(0),
        "not_before": F.lit(None),
        "lease": F.concat(F.lit("1."), F.col("id").cast("string")),
        "deadline": F.lit(None),
        "dead_reason": F.lit(None),
        "seq": F.col("id") + 1,
        "queued_at": F.lit(base) + F.col("id") * 0.001,
        "started_at": F.lit(base + 1.0) + F.col("id") * 0.001,
        "part": F.lit("closed"),
    }
    frame = spark.range(count).select(
        *[expressions[f.name].cast(f.dataType).alias(f.name) for f in schema.fields]
    )
    path = warehouse.table(t.JOBS)
    frame.write.format("delta").mode("append").save(path)
    DeltaTable.forPath(spark, path).optimize().executeCompaction()


def write_offsets(checkpoint: Path, batch_id: int, end: dict[str, dict[int, int]]) -> None:
    """The offset-log entry Spark would have written before running the batch."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    source = {topic: {str(p): o for p, o in parts.items()} for topic, parts in end.items()}
    (checkpoint / "offsets" / str(batch_id)).write_text("v1\n{}\n" + json.dumps(source))


class KafkaBatches:
    """Feeds `BatchWriter` one micro-batch at a time as the streaming query would: the events
    are written to the events topic (one record per 100 events, as a leader's transactions
    group them), read back by Spark's Kafka source and handed over with their end offsets in
    the checkpoint's offset log."""

    def __init__(self, spark: SparkSession, settings: Settings, name: str) -> None:
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition

        from dispatch.streaming.app import topics_of
        from dispatch.streaming.batch import BatchWriter

        self.spark = spark
        self.kafka = settings.kafka
        self.producer = KafkaProducer(
            bootstrap_servers=self.kafka.bootstrap, acks="all", linger_ms=5
        )
        self.consumer = KafkaConsumer(bootstrap_servers=self.kafka.bootstrap, group_id=None)
        self.partition = TopicPartition(self.kafka.events_topic, 0)
        self.checkpoint = settings.paths.var / "checkpoint"
        self.checkpoint.mkdir(parents=True, exist_ok=True)
        (self.checkpoint / "metadata").write_text(json.dumps({"id": f"bench-{name}"}) + "\n")
        self.writer = BatchWriter(
            Warehouse.of(settings), topics_of(settings), Location.at(self.checkpoint)
        )
        self.start_offset = 0

    def __call__(self, events: list[Event]) -> None:
        for index in range(0, len(events), 100):
            self.producer.send(
                self.kafka.events_topic,
                key=GROUP.encode(),
                value=encode_batch(GROUP, 1, events[index : index + 100]),
            )
        self.producer.flush()
        end = self.consumer.end_offsets([self.partition])[self.partition]
        topic = self.kafka.events_topic
        frame = (
            self.spark.read.format("kafka")
            .option("kafka.bootstrap.servers", self.kafka.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", json.dumps({topic: {"0": self.start_offset}}))
            .option("endingOffsets", json.dumps({topic: {"0": end}}))
            .load()
        )
        batch_id = len(self.writer.history)
        write_offsets(self.checkpoint, batch_id, {topic: {0: end}})
        self.writer(frame, batch_id)
        self.start_offset = end

    def close(self) -> None:
        self.producer.close()
        self.consumer.close()


def merge_cost(
    spark: SparkSession, base: Settings, history: int, batch_jobs: int, batches: int
) -> MergeResult:
    from dispatch.delta import tables as t
    from dispatch.delta.snapshot import latest_snapshot

    settings = with_namespace(base, f"merge-{history}", base.paths.var.parent)
    warehouse = Warehouse.of(settings)
    t.create_tables(spark, warehouse)
    started = time.perf_counter()
    bulk_history(spark, warehouse, history)
    history_load_s = time.perf_counter() - started

    batch = KafkaBatches(spark, settings, str(history))
    writer = batch.writer
    emulator = Emulator(workers=4, prefix=f"live{history}")
    clock = 1_800_000_000.0

    # A backlog of queued jobs (the open partition), then steady batches: each submits N jobs
    # and assigns + acks N, so it inserts, updates and moves N rows to the closed partition.
    events = emulator.start(clock)
    events += emulator.tick(clock, emulator.requests(2 * batch_jobs), clock)
    batch(events)
    for _ in range(batches + 1):
        clock += 5.0
        step = emulator.credit(clock, per_worker=batch_jobs // len(emulator.workers))
        step += emulator.tick(clock, emulator.requests(batch_jobs), clock)
        clock += 2.0
        step += emulator.tick(clock, [], clock)
        batch(step)
    batch.close()
    measured = writer.history[2:]  # the backlog batch and one warm-up batch excluded
    metrics = [
        commit.get("operationMetrics", {})
        for commit in warehouse.open(t.JOBS).history(batches)
        if commit.get("operation") == "MERGE"
    ]
    started = time.perf_counter()
    snapshot = latest_snapshot(warehouse, GROUP)
    snapshot_load_s = time.perf_counter() - started
    return MergeResult(
        history=history,
        batch_jobs=batch_jobs,
        batches=len(measured),
        jobs_merge_s=percentiles([h.jobs_merge_s for h in measured]),
        batch_total_s=percentiles([h.total_s for h in measured]),
        stats_write_s=percentiles([h.stats_write_s for h in measured]),
        # delta-rs's MERGE metrics (the batch's MERGE is delta-rs's).
        merge_files_scanned_median=_median_metric(metrics, "num_target_files_scanned"),
        merge_files_skipped_median=_median_metric(metrics, "num_target_files_skipped_during_scan"),
        merge_files_removed_median=_median_metric(metrics, "num_target_files_removed"),
        merge_scan_ms_median=_median_metric(metrics, "scan_time_ms"),
        history_load_s=round(history_load_s, 1),
        snapshot_load_s=round(snapshot_load_s, 2),
        snapshot_jobs=len(snapshot.jobs) if snapshot else 0,
    )


# --- batch cost against the backlog of queued jobs -----------------------------------------------


@dataclass
class BacklogResult:
    backlog: int
    """Queued jobs in the open partition of `jobs` before the measured batches."""
    history: int
    batch_jobs: int
    batches: int
    batch_total_s: dict[str, float]
    steps_s: dict[str, dict[str, float]]
    """Per step, its p50/p95/max over the measured batches: `read` (the touched jobs' current
    rows), `fold` (decode, fence and fold without the read), `jobs_merge`, `other_commits`
    (`events`, `stats_partial`, `rejected`), `collect` (the Kafka read into the driver)."""
    merge_metrics_median: dict[str, float]
    """delta-rs's metrics of the batches' `jobs` MERGEs (median over the measured ones)."""
    merge_rows_copied: list[int]
    """Rows each measured batch's MERGE copied from the files it rewrote, oldest first (does
    the rewrite grow as the batches go on?)."""
    first_read_s: float
    """The read of the warm-up batch (the first that touches jobs: a cache would load here)."""
    open_files: int
    """Files of the open partition after the run."""
    backlog_load_s: float
    rss_mb: dict[str, float]
    """The bench process's resident memory (the emulator's core holds the backlog too):
    before the first batch, after the run, and the peak."""
    arrow_mb: dict[str, float]
    """Bytes held by Arrow's memory pool, before the first batch and after the run."""


def _rss_mb() -> float:
    """This process's resident set, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return math.nan


def bulk_backlog(
    warehouse: Warehouse, emulator: Emulator, count: int, now: float, batch_jobs: int
) -> None:
    """`count` jobs queued in the emulator's core (no worker has credit yet) and their rows in
    the open partition of `jobs` in files as the fold's batches would have written them (of the
    table's `delta.targetFileSize`, or else one a batch), then compacted as the maintenance
    does (`Maintenance.optimize`)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from dispatch.delta import tables as t
    from dispatch.delta.job_rows import JobState, job_row
    from dispatch.streaming.maintenance import Maintenance

    table = warehouse.open(t.JOBS)
    target = table.metadata().configuration.get("delta.targetFileSize")
    chunk = 100_000
    for start in range(0, count, chunk):
        requests = emulator.requests(min(chunk, count - start))
        emulator.core.submit_many(requests, now)
        rows = []
        for request in requests:
            record = emulator.core.job(request.id)
            assert record is not None
            rows.append(job_row(GROUP, JobState(record, queued_at=now)))
        arrow = pa.Table.from_pylist(rows, schema=t.SCHEMAS[t.JOBS])
        # Files of the table's target size if it has one (the MERGE's output), else a file a
        # batch (the writer closes a file after each record batch over its target).
        write_deltalake(
            table,
            arrow.to_batches(max_chunksize=batch_jobs),
            mode="append",
            target_file_size=int(target) if target else 1,
        )
        table.update_incremental()
    if count:
        Maintenance(warehouse).optimize([t.JOBS])


def backlog_cost(
    spark: SparkSession, base: Settings, backlog: int, history: int, batch_jobs: int, batches: int
) -> BacklogResult:
    """Identical batches over a backlog of `backlog` queued jobs: each batch submits N jobs
    (queued behind the backlog), assigns N from the head of the queues and acks the N it
    assigned the batch before (the jobs run for one batch), so every batch inserts N open rows,
    updates N and moves N to the closed partition, whatever the backlog. Job ids are random
    uuid4 hex, as clients choose them."""
    import pyarrow as pa

    from dispatch.delta import tables as t

    settings = with_namespace(base, f"backlog-{backlog}", base.paths.var.parent)
    warehouse = Warehouse.of(settings)
    t.create_tables(spark, warehouse)
    bulk_history(spark, warehouse, history)
    # The cap never limits: N running per batch over 5 clients.
    emulator = Emulator(workers=4, prefix="live", cap=10 * batch_jobs, id_seed=backlog + 1)
    clock = 1_800_000_000.0
    events = emulator.start(clock)
    started = time.perf_counter()
    bulk_backlog(warehouse, emulator, backlog, clock, batch_jobs)
    backlog_load_s = time.perf_counter() - started
    # The emulator's core holds the backlog's records in this process (a leader is a process
    # of its own): out of reach of the collector, they do not slow the fold's allocations.
    gc.collect()
    gc.freeze()

    batch = KafkaBatches(spark, settings, f"backlog-{backlog}")
    writer = batch.writer
    rss_before, arrow_before = _rss_mb(), pa.total_allocated_bytes() / 2**20
    batch(events)  # the election and the workers joining: no job touched
    for _ in range(batches + 1):
        clock += 5.0
        # Credit assigns N from the head of the queues; the new jobs queue behind them; the
        # jobs assigned one batch earlier complete.
        step = emulator.credit(clock, per_worker=batch_jobs // len(emulator.workers))
        step += emulator.tick(clock, emulator.requests(batch_jobs), clock - 1.0)
        batch(step)
    batch.close()
    gc.unfreeze()
    measured = writer.history[2:]  # the start batch and one warm-up batch excluded
    jobs = warehouse.open(t.JOBS)
    metrics = [
        commit.get("operationMetrics", {})
        for commit in reversed(jobs.history(batches))
        if commit.get("operation") == "MERGE"
    ]
    metric_names = (
        "num_target_files_scanned", "num_target_files_skipped_during_scan",
        "num_target_files_removed", "num_target_files_added", "num_target_rows_copied",
        "num_output_rows", "scan_time_ms", "rewrite_time_ms", "execution_time_ms",
    )  # fmt: skip
    steps: dict[str, list[float]] = {
        "read": [h.read_s for h in measured],
        "fold": [h.fold_s - h.read_s for h in measured],
        "jobs_merge": [h.jobs_merge_s for h in measured],
        "other_commits": [h.events_write_s + h.stats_write_s + h.prune_s for h in measured],
        "collect": [h.collect_s for h in measured],
    }
    open_files = len(jobs.file_uris(file_pruning_predicate=[("part", "=", "open")]))

    return BacklogResult(
        backlog=backlog,
        history=history,
        batch_jobs=batch_jobs,
        batches=len(measured),
        batch_total_s=percentiles([h.total_s for h in measured]),
        steps_s={
            name: {k: v for k, v in percentiles(values).items() if k in ("p50", "p95", "max")}
            for name, values in steps.items()
        },
        merge_metrics_median={name: _median_metric(metrics, name) for name in metric_names},
        merge_rows_copied=[int(m.get("num_target_rows_copied", 0)) for m in metrics],
        first_read_s=round(writer.history[1].read_s, 3) if len(writer.history) > 1 else 0.0,
        open_files=open_files,
        backlog_load_s=round(backlog_load_s, 1),
        rss_mb={
            "before": rss_before,
            "after": _rss_mb(),
            "peak": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        },
        arrow_mb={
            "before": round(arrow_before, 1),
            "after": round(pa.total_allocated_bytes() / 2**20, 1),
        },
    )


def describe_backlog(results: Sequence[BacklogResult]) -> str:
    """One line per backlog size: the batch's p50/p95 and where it goes."""
    head = ("backlog", "batch p50", "p95", "read", "fold", "jobs MERGE", "other", "collect")
    lines = [
        f"batch cost against the backlog ({results[0].batch_jobs:,} jobs submitted, assigned "
        f"and completed a batch; p50 / p95 in s)"
        if results
        else "no backlog run",
        " ".join(f"{name:>13}" for name in head) + "  MERGE files scanned/rewritten, rows copied",
    ]
    for r in results:
        cells = [f"{r.backlog:>13,}"]
        cells += [f"{r.batch_total_s.get(k, math.nan):>13.3f}" for k in ("p50", "p95")]
        for name in ("read", "fold", "jobs_merge", "other_commits", "collect"):
            step = r.steps_s[name]
            cells.append(f"{step.get('p50', math.nan):>6.3f}/{step.get('p95', math.nan):<6.3f}")
        m = r.merge_metrics_median
        cells.append(
            f"  {m['num_target_files_scanned']:g}/{m['num_target_files_removed']:g}, "
            f"{m['num_target_rows_copied']:,.0f}"
        )
        lines.append(" ".join(cells))
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------------


@unwinds_on_sigterm
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch.bench.streaming_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="jobs/s of the freshness run")
    parser.add_argument("--duration", type=float, default=120.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before measuring")
    parser.add_argument("--run-s", type=float, default=1.0, help="seconds each job runs")
    parser.add_argument(
        "--optimize-every", type=float, default=600.0, help="compaction interval (s)"
    )
    parser.add_argument("--history", default="10000,100000,1000000", help="history sizes")
    parser.add_argument(
        "--backlog", default="", help="queued-job backlog sizes (e.g. 0,100000,1000000)"
    )
    parser.add_argument(
        "--backlog-history", type=int, default=10_000, help="finished jobs in the backlog runs"
    )
    parser.add_argument("--batch-jobs", type=int, default=1000, help="jobs per MERGE batch")
    parser.add_argument("--batches", type=int, default=6, help="measured MERGE batches per size")
    parser.add_argument("--skip-freshness", action="store_true")
    parser.add_argument("--skip-merge", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the results as JSON to this file")
    parser.add_argument(
        "--fold-on", choices=["auto", "executors", "driver"], default="auto",
        help="where the streaming query folds each batch",
    )  # fmt: skip
    parser.add_argument(
        "--cluster-workers", type=int, default=0,
        help="run the fold on a standalone cluster of this many workers (0: local[2])",
    )  # fmt: skip
    parser.add_argument("--worker-cores", type=int, default=1, help="cores per cluster worker")
    args = parser.parse_args(argv)

    from dispatch.streaming.session import spark_session

    results: dict[str, Any] = {"machine_cores": multiprocessing.cpu_count()}
    with contextlib.ExitStack() as resources:
        scratch = resources.enter_context(
            tempfile.TemporaryDirectory(prefix="dispatch-streaming-bench-")
        )
        settings = resources.enter_context(stack(Path(scratch) / "stack"))
        if args.cluster_workers:
            settings = resources.enter_context(
                standalone_cluster(settings, args.cluster_workers, args.worker_cores)
            )
        results["spark"] = {
            "master": settings.spark.master,
            "workers": args.cluster_workers,
            "cores_per_worker": args.worker_cores if args.cluster_workers else None,
        }
        spark = spark_session(settings, "dispatch-streaming-bench")
        spark.sparkContext.setLogLevel("ERROR")
        try:
            if not args.skip_freshness:
                fresh = freshness(
                    spark,
                    settings,
                    args.rate,
                    args.duration,
                    args.warmup,
                    args.optimize_every,
                    args.run_s,
                    args.fold_on,
                )
                results["freshness"] = asdict(fresh)
                print(describe(fresh), flush=True)
            if not args.skip_merge:
                merges = []
                for size in (int(part) for part in args.history.split(",") if part):
                    merge = merge_cost(spark, settings, size, args.batch_jobs, args.batches)
                    merges.append(asdict(merge))
                    print(json.dumps(merges[-1], indent=1), flush=True)
                results["merge"] = merges
            backlogs = []
            for size in (int(part) for part in args.backlog.split(",") if part):
                backlogs.append(
                    backlog_cost(
                        spark, settings, size, args.backlog_history, args.batch_jobs, args.batches
                    )
                )
                print(json.dumps(asdict(backlogs[-1]), indent=1), flush=True)
            if backlogs:
                results["backlog"] = [asdict(result) for result in backlogs]
                print(describe_backlog(backlogs), flush=True)
        finally:
            spark.stop()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

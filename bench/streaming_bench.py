"""Streaming benchmark: freshness of the Delta tables, and MERGE cost against history size.

    .venv/bin/python -m bench.streaming_bench                       # both parts
    .venv/bin/python -m bench.streaming_bench --skip-merge --rate 1000 --duration 120
    .venv/bin/python -m bench.streaming_bench --skip-freshness --history 10000,100000,1000000

Everything runs on a temporary broker (free ports) and a temporary warehouse.

**Freshness.** A leader emulator (a process of its own, so it does not share this process's
GIL) runs the pure dispatcher core at `--rate` jobs/s: every 10 ms it submits the jobs due,
assigns them to workers with plenty of credit and acks those assigned `--run-s` ago, and
writes what that tick decided as one `dispatch.events` record (as the leader's transactions
do), plus one `dispatch.submit` record per job. The streaming application runs in this
process with its production options. Afterwards the events topic is read back: an event is
visible in `jobs` when the first `jobs` commit whose recorded offsets cover its record is
committed, so freshness = that commit's timestamp - the event's `at` (same clock).

**MERGE cost.** For each history size H, a fresh `jobs` table gets H finished jobs (bulk
written, then compacted, as a long-running table would be) and a backlog of queued jobs; then
identical batches (N new jobs submitted, N jobs assigned and acked, so every batch inserts,
updates and moves rows) go through `BatchWriter` one by one, and the per-step times are
recorded. The first batch after the bulk load is a warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Assigned, Event, JobEvent
from dispatch.event_records import decode_batch, encode_batch
from dispatch.settings import Settings, load_settings
from dispatch.settings import with_namespace as namespace_settings
from dispatch.stack.broker import Broker, create_topics
from dispatch.stack.ports import free_port
from dispatch.submit_records import submit_record_value

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

GROUP = "default"
TICK_S = 0.01
EXECS = ("image.resize", "image.crop", "text.index", "mail.send")


# --- the leader emulator ---------------------------------------------------------------------


class Emulator:
    """The pure core driven like the leader drives it, one tick at a time."""

    def __init__(self, workers: int = 8, prefix: str = "job") -> None:
        self.core = Dispatcher(
            CoreConfig(ack_timeout_s=600.0, max_ack_timeout_s=600.0, worker_expiry_s=None)
        )
        self.prefix = prefix
        self.next_id = 0
        self.assigned: list[tuple[float, str, int, str]] = []
        """(when, job id, attempt, lease) of assignments not acked yet, oldest first."""
        self.workers = [f"w{index}" for index in range(workers)]

    def start(self, now: float) -> list[Event]:
        events = self.core.begin_epoch(1, now, holder="bench")
        for worker in self.workers:
            events += self.core.join(worker, ["job.assign.>"], now)
        return events

    def requests(self, count: int) -> list[SubmitRequest]:
        out = []
        for _ in range(count):
            index = self.next_id
            self.next_id += 1
            out.append(
                SubmitRequest(
                    id=f"{self.prefix}-{index}",
                    exec=EXECS[index % len(EXECS)],
                    payload={"n": index},
                    client_id=f"client-{index % 5}",
                )
            )
        return out

    def credit(self, now: float, per_worker: int) -> list[Event]:
        events: list[Event] = []
        for worker in self.workers:
            events += self.core.grant_credit(worker, per_worker, now, replace=True)
        return self._track(events, now)

    def tick(self, now: float, submit: list[SubmitRequest], ack_before: float) -> list[Event]:
        events = self.core.submit_many(submit, now) if submit else []
        self._track(events, now)
        due = 0
        while due < len(self.assigned) and self.assigned[due][0] <= ack_before:
            due += 1
        if due:
            acks = [
                (job_id, attempt, lease, {"ok": True})
                for _, job_id, attempt, lease in self.assigned[:due]
            ]
            del self.assigned[:due]
            done, _ = self.core.ack_many(acks, now)
            events += self._track(done, now)
        return events

    def _track(self, events: list[Event], now: float) -> list[Event]:
        for event in events:
            if isinstance(event, Assigned):
                self.assigned.append((now, event.job_id, event.attempt, event.lease))
        return events


def emulate_leader(
    bootstrap: str,
    submit_topic: str,
    events_topic: str,
    rate: float,
    run_s: float,
    duration_s: float,
) -> None:
    """The leader emulator's process: `rate` jobs/s for `duration_s`, as described above."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, batch_size=256 * 1024
    )
    emulator = Emulator()
    started = time.time()
    producer.send(
        events_topic, key=GROUP.encode(), value=encode_batch(GROUP, 1, emulator.start(started))
    )
    submitted = 0
    next_credit = 0.0
    while True:
        now = time.time()
        elapsed = now - started
        if elapsed >= duration_s:
            break
        events: list[Event] = []
        if now >= next_credit:
            # Workers that always have room: credit is not what this benchmark measures.
            events += emulator.credit(now, per_worker=int(rate * (run_s + 2)))
            next_credit = now + 1.0
        due = int(elapsed * rate) - submitted
        requests = emulator.requests(max(0, due))
        submitted += len(requests)
        for request in requests:
            producer.send(submit_topic, key=request.id.encode(), value=submit_record_value(request))
        events += emulator.tick(now, requests, now - run_s)
        if events:
            producer.send(events_topic, key=GROUP.encode(), value=encode_batch(GROUP, 1, events))
        time.sleep(max(0.0, TICK_S - (time.time() - now)))
    producer.flush()
    producer.close()


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


def with_namespace(settings: Settings, name: str, scratch: Path) -> Settings:
    """`dispatch.settings.with_namespace` under `scratch / name`, with the topics created."""
    namespaced = namespace_settings(settings, name, scratch / name)
    create_topics(namespaced.kafka)
    return namespaced


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 3)

    return {
        "p50": at(0.50),
        "p95": at(0.95),
        "p99": at(0.99),
        "max": round(ordered[-1], 3),
        "n": len(ordered),
    }


# --- freshness ---------------------------------------------------------------------------------


@dataclass
class FreshnessResult:
    rate: float
    duration_s: float
    warmup_s: float
    jobs_submitted: int
    freshness_s: dict[str, float]
    batches: int
    batch_s: dict[str, float]
    steps_median_s: dict[str, float]
    records_per_batch_median: float
    rollup_runs: int
    rollup_s: dict[str, float]
    maintenance_runs: int
    maintenance_s: dict[str, float]


def commits_of(warehouse: Path, events_topic: str) -> list[tuple[float, dict[int, int]]]:
    """(commit time, events offsets covered) of every batch commit of `jobs`, oldest first."""
    from deltalake import DeltaTable

    from streaming import tables as t
    from streaming.progress import BATCH, Progress

    out = []
    for commit in DeltaTable(str(t.table_path(warehouse, t.JOBS))).history():
        progress = Progress.from_json(commit.get("userMetadata"))
        if progress is not None and progress.kind == BATCH:
            out.append((commit["timestamp"] / 1000.0, progress.offsets.get(events_topic, {})))
    out.sort(key=lambda item: item[0])
    return out


def event_times(settings: Settings) -> list[tuple[int, int, list[float]]]:
    """(partition, offset, [at of each job event]) of every events record."""
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
                events = decode_batch(record.value).events
                out.append(
                    (
                        record.partition,
                        record.offset,
                        [e.at for e in events if isinstance(e, JobEvent)],
                    )
                )
    consumer.close()
    return out


def freshness(
    spark: SparkSession,
    settings: Settings,
    rate: float,
    duration_s: float,
    warmup_s: float,
    optimize_every_s: float,
) -> FreshnessResult:
    from streaming.app import StreamOptions, start
    from streaming.maintenance import MaintenancePolicy

    settings = with_namespace(settings, f"fresh-{int(rate)}", settings.paths.var.parent)
    kafka = settings.kafka
    leader = multiprocessing.get_context("spawn").Process(
        target=emulate_leader,
        args=(
            kafka.bootstrap,
            kafka.submit_topic,
            kafka.events_topic,
            rate,
            1.0,
            duration_s + warmup_s,
        ),
        daemon=True,
    )
    options = StreamOptions(maintenance=MaintenancePolicy(optimize_every_s=optimize_every_s))
    query, writer = start(settings, spark, options=options)
    leader.start()
    began = time.time()
    leader.join(duration_s + warmup_s + 120)
    # Let the stream catch up with the tail, then stop.
    deadline = time.monotonic() + 120
    from streaming.lag import streaming_lag

    while time.monotonic() < deadline and any(streaming_lag(settings).values()):
        time.sleep(1.0)
    query.stop()
    commits = commits_of(settings.paths.warehouse, kafka.events_topic)
    samples: list[float] = []
    measured_from = began + warmup_s
    position = 0
    for partition, offset, ats in sorted(event_times(settings), key=lambda item: item[1]):
        while position < len(commits) and commits[position][1].get(partition, 0) <= offset:
            position += 1
        if position == len(commits):
            break
        visible = commits[position][0]
        samples.extend(visible - at for at in ats if at >= measured_from)
    history = [h for h in writer.history if h.total_s > 0]
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
        rate=rate,
        duration_s=duration_s,
        warmup_s=warmup_s,
        jobs_submitted=int(rate * (duration_s + warmup_s)),
        freshness_s=percentiles(samples),
        batches=len(history),
        batch_s=percentiles([h.total_s for h in history]),
        steps_median_s={
            step: round(statistics.median(getattr(h, step) for h in history), 3) for step in steps
        },
        records_per_batch_median=statistics.median(h.records for h in history) if history else 0,
        rollup_runs=sum(1 for h in history if h.rollup_s > 0),
        rollup_s=percentiles([h.rollup_s for h in history if h.rollup_s > 0]),
        maintenance_runs=sum(1 for h in history if h.maintenance_steps),
        maintenance_s=percentiles([h.maintenance_s for h in history if h.maintenance_steps]),
    )


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


def bulk_history(spark: SparkSession, warehouse: Path, count: int) -> None:
    """`count` succeeded jobs in the closed partition, then compacted."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from streaming import tables as t

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
    path = str(t.table_path(warehouse, t.JOBS))
    frame.write.format("delta").mode("append").save(path)
    DeltaTable.forPath(spark, path).optimize().executeCompaction()


def write_offsets(checkpoint: Path, batch_id: int, end: dict[str, dict[int, int]]) -> None:
    """The offset-log entry Spark would have written before running the batch."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    source = {topic: {str(p): o for p, o in parts.items()} for topic, parts in end.items()}
    (checkpoint / "offsets" / str(batch_id)).write_text("v1\n{}\n" + json.dumps(source))


def merge_cost(
    spark: SparkSession, base: Settings, history: int, batch_jobs: int, batches: int
) -> MergeResult:
    from deltalake import DeltaTable
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from streaming import tables as t
    from streaming.app import topics_of
    from streaming.batch import BatchWriter
    from streaming.snapshot import latest_snapshot

    settings = with_namespace(base, f"merge-{history}", base.paths.var.parent)
    warehouse = settings.paths.warehouse
    t.create_tables(spark, warehouse)
    started = time.perf_counter()
    bulk_history(spark, warehouse, history)
    history_load_s = time.perf_counter() - started

    kafka = settings.kafka
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all", linger_ms=5)
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=None)
    events_partition = TopicPartition(kafka.events_topic, 0)
    checkpoint = settings.paths.var / "checkpoint"
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": f"bench-{history}"}) + "\n")
    writer = BatchWriter(warehouse, topics_of(settings), checkpoint)
    emulator = Emulator(workers=4, prefix=f"live{history}")
    clock = 1_800_000_000.0
    start_offset = 0

    def batch(events: list[Event]) -> None:
        nonlocal start_offset
        # One record per 100 events, as a leader's transactions would group them.
        for index in range(0, len(events), 100):
            producer.send(
                kafka.events_topic,
                key=GROUP.encode(),
                value=encode_batch(GROUP, 1, events[index : index + 100]),
            )
        producer.flush()
        end = consumer.end_offsets([events_partition])[events_partition]
        frame = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribe", kafka.events_topic)
            .option("startingOffsets", json.dumps({kafka.events_topic: {"0": start_offset}}))
            .option("endingOffsets", json.dumps({kafka.events_topic: {"0": end}}))
            .load()
        )
        batch_id = len(writer.history)
        write_offsets(checkpoint, batch_id, {kafka.events_topic: {0: end}})
        writer(frame, batch_id)
        start_offset = end

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
    producer.close()
    consumer.close()
    measured = writer.history[2:]  # the backlog batch and one warm-up batch excluded
    metrics = [
        commit.get("operationMetrics", {})
        for commit in DeltaTable(str(t.table_path(warehouse, t.JOBS))).history(batches)
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


# --- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.streaming_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="jobs/s of the freshness run")
    parser.add_argument("--duration", type=float, default=120.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before measuring")
    parser.add_argument(
        "--optimize-every", type=float, default=600.0, help="compaction interval (s)"
    )
    parser.add_argument("--history", default="10000,100000,1000000", help="history sizes")
    parser.add_argument("--batch-jobs", type=int, default=1000, help="jobs per MERGE batch")
    parser.add_argument("--batches", type=int, default=6, help="measured MERGE batches per size")
    parser.add_argument("--skip-freshness", action="store_true")
    parser.add_argument("--skip-merge", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    from streaming.session import spark_session

    results: dict[str, Any] = {"machine_cores": multiprocessing.cpu_count()}
    with (
        tempfile.TemporaryDirectory(prefix="dispatch-streaming-bench-") as scratch,
        stack(Path(scratch) / "stack") as settings,
    ):
        spark = spark_session(settings, "dispatch-streaming-bench")
        spark.sparkContext.setLogLevel("ERROR")
        try:
            if not args.skip_freshness:
                fresh = freshness(
                    spark, settings, args.rate, args.duration, args.warmup, args.optimize_every
                )
                results["freshness"] = asdict(fresh)
                print(json.dumps(results["freshness"], indent=1), flush=True)
            if not args.skip_merge:
                merges = []
                for size in (int(part) for part in args.history.split(",") if part):
                    merge = merge_cost(spark, settings, size, args.batch_jobs, args.batches)
                    merges.append(asdict(merge))
                    print(json.dumps(merges[-1], indent=1), flush=True)
                results["merge"] = merges
        finally:
            spark.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

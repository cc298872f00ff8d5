"""Rebuild benchmark: how long a new leader takes to start over a large history.

    .venv/bin/python -m dispatch.bench.rebuild_bench                    # 1M finished + 10k active
    .venv/bin/python -m dispatch.bench.rebuild_bench --history 20000 --repeats 1   # a quick check

Everything runs on a temporary broker (free ports) and a temporary warehouse.

**Build (not timed).** The real core (`Dispatcher`) runs a simulated history, and its events
go to `dispatch.events` as records of one simulated leader iteration each (50 ms apart):
`--history` jobs submitted at `--history-rate` jobs/s by 50 clients, each assigned to one of
8 workers and acked by the next iteration. The real streaming fold
(`dispatch.streaming.app.run(..., available_now=True)`, batches of `--fold-records` records) folds
that into Delta, and `jobs` is compacted by the application's own maintenance (as the running
application does every 10 minutes). Then, at the wall clock, `--queued` + `--running` active
jobs (the workers' credit covers exactly `--running` of them, and `default_cap` 100 times 50
clients allows 5,000; `timeout_s` 3600, so their deadlines are still ahead while the bench
measures) are folded by a second run, whose last `jobs` commit is the snapshot pointer. Then
a tail is written after it and not folded: `--tail-jobs` running jobs complete, as many
queued ones are assigned, as many new ones are submitted.

**Measure.** In a fresh process (a new leader's process holds nothing of the build), with the
modules a standby node has loaded already imported and its GC thresholds: `--repeats` real
`dispatch.api.leader.Leader` terms are started (`start()`: fence, snapshot, restore, tail replay,
`leader_elected` commit) and stopped; one more under cProfile (unless `--no-profile`); then
each step alone: `latest_snapshot`, `Dispatcher.restore`, the tail's replay, `EventLog`
initialisation; and, as the baseline, the rebuild without a snapshot: the whole log replayed
into an empty core. Each figure is wall time and the process's CPU time (the machine is
shared: CPU time is what the wall time would be without the other load, for the
single-threaded parts).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import logging
import math
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Assigned, Event
from dispatch.event_records import encode_batches
from dispatch.settings import Settings
from dispatch.warehouse import Warehouse

if TYPE_CHECKING:
    from kafka import KafkaProducer
    from pyspark.sql import SparkSession

    from dispatch.api.leader import Leader

GROUP = "default"
EXEC = "bench.noop"
WORKERS = tuple(f"w{index}" for index in range(8))
CLIENTS = 50
TICK_S = 0.05
"""Simulated time between two leader iterations (one events record each)."""
ACTIVE_TIMEOUT_S = 3600.0
"""The active jobs' first timeout: their deadlines stay ahead while the bench measures."""
TAIL_STEP_JOBS = 50
"""Jobs completed (and assigned, and submitted) per record of the tail."""


@dataclass(frozen=True)
class Shape:
    history: int = 1_000_000
    queued: int = 5_000
    running: int = 5_000
    tail_jobs: int = 1_000
    rate: float = 200.0
    """Jobs/s of the simulated history."""


# --- the simulated history ---------------------------------------------------------------------


class EventsWriter:
    """Writes the core's decisions to `dispatch.events`, one iteration's events per record."""

    def __init__(self, settings: Settings) -> None:
        from kafka import KafkaProducer

        self.topic = settings.kafka.events_topic
        self.producer: KafkaProducer = KafkaProducer(
            bootstrap_servers=settings.kafka.bootstrap,
            acks="all",
            linger_ms=20,
            batch_size=1024 * 1024,
            max_request_size=16 * 1024 * 1024,
        )
        self.records = 0
        self.events = 0

    def write(self, epoch: int, events: Sequence[Event]) -> None:
        if not events:
            return
        # As a leader writes them: the last record carries the submit position (this history
        # consumed no submission: an empty one).
        for record in encode_batches(GROUP, epoch, events, submit={}):
            self.producer.send(self.topic, key=GROUP.encode(), value=record)
            self.records += 1
        self.events += len(events)

    def close(self) -> None:
        self.producer.flush()
        self.producer.close()


@dataclass(frozen=True, slots=True)
class Running:
    job_id: str
    worker_id: str
    attempt: int
    lease: str


class HistoryGenerator:
    """The pure core driven like a leader with 8 REST workers, on a simulated clock."""

    def __init__(self, config: CoreConfig, writer: EventsWriter, clock: float) -> None:
        # Simulated time: workers are never silent (credit renews their last_seen anyway).
        self.core = Dispatcher(replace(config, worker_expiry_s=None))
        self.writer = writer
        self.clock = clock
        self.next_id = 0
        self.running: list[Running] = []
        """Assigned and not acked yet, oldest first."""

    def _emit(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Assigned):
                self.running.append(
                    Running(event.job_id, event.worker_id, event.attempt, event.lease)
                )
        self.writer.write(self.core.epoch, events)

    def _requests(self, count: int, timeout_s: float | None = None) -> list[SubmitRequest]:
        first = self.next_id
        self.next_id += count
        return [
            SubmitRequest(
                id=f"job-{n}",
                exec=EXEC,
                payload={"n": n},
                client_id=f"client-{n % CLIENTS}",
                timeout_s=timeout_s,
            )
            for n in range(first, first + count)
        ]

    def _ack(self, done: list[Running]) -> list[Event]:
        acks = [(r.job_id, r.attempt, r.lease, {"ok": True}) for r in done]
        events, refused = self.core.ack_many(acks, self.clock)
        if refused:
            raise RuntimeError(f"the generator's own acks were refused: {refused[:3]}")
        return events

    def start(self) -> None:
        events = self.core.begin_epoch(1, self.clock, holder="rebuild-bench")
        for worker in WORKERS:
            events += self.core.join(worker, ["job.assign.>"], self.clock)
        self._emit(events)

    def history(self, jobs: int, rate: float) -> None:
        """`jobs` jobs at `rate`/s, each acked by the iteration after its assignment."""
        per_tick = max(1, round(rate * TICK_S))
        credit_every = max(1, round(1.0 / TICK_S))
        tick = 0
        while self.next_id < jobs or self.running:
            self.clock += TICK_S
            events: list[Event] = []
            if tick % credit_every == 0:
                for worker in WORKERS:
                    room = 2 * math.ceil(rate / len(WORKERS))
                    events += self.core.grant_credit(worker, room, self.clock, replace=True)
            done, self.running = self.running, []
            events += self._ack(done) if done else []
            count = min(per_tick, jobs - self.next_id)
            events += self.core.submit_many(self._requests(count), self.clock) if count else []
            self._emit(events)
            tick += 1

    def active(self, queued: int, running: int, rate: float, clock: float) -> None:
        """Credit for exactly `running` jobs, then `queued + running` jobs at `rate`/s,
        from `clock` on (now: the fold of the history took a while)."""
        self.clock = max(self.clock, clock) + TICK_S
        events: list[Event] = []
        for index, worker in enumerate(WORKERS):
            room = running // len(WORKERS) + (1 if index < running % len(WORKERS) else 0)
            events += self.core.grant_credit(worker, room, self.clock, replace=True)
        self._emit(events)
        per_tick = max(1, round(rate * TICK_S))
        left = queued + running
        while left:
            self.clock += TICK_S
            count = min(per_tick, left)
            left -= count
            requests = self._requests(count, timeout_s=ACTIVE_TIMEOUT_S)
            self._emit(self.core.submit_many(requests, self.clock))

    def tail(self, jobs: int, clock: float) -> None:
        """`jobs` running jobs complete; their workers' credit returns, so as many queued
        ones are assigned; as many new ones are submitted."""
        self.clock = max(self.clock, clock)
        while jobs > 0:
            self.clock += TICK_S
            step = min(TAIL_STEP_JOBS, jobs)
            jobs -= step
            done, self.running = self.running[:step], self.running[step:]
            events = self._ack(done)
            returned: dict[str, int] = {}
            for run in done:
                returned[run.worker_id] = returned.get(run.worker_id, 0) + 1
            for worker, credits in sorted(returned.items()):
                events += self.core.grant_credit(worker, credits, self.clock)
            requests = self._requests(step, timeout_s=ACTIVE_TIMEOUT_S)
            events += self.core.submit_many(requests, self.clock)
            self._emit(events)


# --- the build ----------------------------------------------------------------------------------


@dataclass
class FoldRun:
    batches: int
    seconds: float
    batch_total_s_max: float
    events: int


@dataclass
class BuildResult:
    history_records: int
    history_events: int
    generate_s: float
    fold_history: FoldRun
    compact_s: float
    active_records: int
    fold_active: FoldRun
    tail_records: int
    tail_events: int
    snapshot_version: int
    snapshot_offsets: dict[int, int]
    log_end_before_tail: dict[int, int]
    jobs_files_at_snapshot: int
    counts_at_snapshot: dict[str, int]
    counts_after_tail: dict[str, int]


def events_end(settings: Settings) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, group_id=None)
    try:
        topic = settings.kafka.events_topic
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def fold(spark: SparkSession, settings: Settings, fold_records: int) -> FoldRun:
    """The real streaming application over what the topics hold now (available now)."""
    from dispatch.streaming.app import StreamOptions, run

    options = StreamOptions(max_offsets_per_trigger=fold_records, maintenance=None)
    started = time.perf_counter()
    writer = run(settings, spark=spark, options=options, available_now=True)
    if writer is None:  # only a stop asked before the start gives none
        raise RuntimeError("the fold did not start")
    history = [h for h in writer.history if h.total_s > 0]
    return FoldRun(
        batches=len(history),
        seconds=round(time.perf_counter() - started, 1),
        batch_total_s_max=round(max((h.total_s for h in history), default=0.0), 2),
        events=sum(h.events for h in history),
    )


def compact_jobs(spark: SparkSession, settings: Settings) -> float:
    """`jobs` compacted by the application's maintenance, as the running stream does."""
    from dispatch.delta import tables as t
    from dispatch.streaming.maintenance import Maintenance

    started = time.perf_counter()
    Maintenance(Warehouse.of(settings)).optimize([t.JOBS])
    return round(time.perf_counter() - started, 1)


def jobs_files(settings: Settings, version: int) -> int:
    from dispatch.delta import tables as t

    return len(Warehouse.of(settings).open(t.JOBS, version=version).file_uris())


def build(spark: SparkSession, settings: Settings, shape: Shape, fold_records: int) -> BuildResult:
    """History → fold → compaction → active jobs → fold (the snapshot) → the tail."""
    from dispatch.delta.snapshot import latest_snapshot

    span_s = (shape.history + shape.queued + shape.running) / shape.rate
    writer = EventsWriter(settings)
    generator = HistoryGenerator(
        settings.dispatcher.core_config(), writer, clock=time.time() - span_s - 60.0
    )
    started = time.perf_counter()
    generator.start()
    generator.history(shape.history, shape.rate)
    writer.producer.flush()
    generate_s = time.perf_counter() - started
    history_records, history_events = writer.records, writer.events
    print(f"history: {history_events:,} events in {history_records:,} records, "
          f"{generate_s:.0f} s", flush=True)  # fmt: skip
    fold_history = fold(spark, settings, fold_records)
    print(f"history folded: {fold_history}", flush=True)
    compact_s = compact_jobs(spark, settings)

    generator.active(shape.queued, shape.running, shape.rate, time.time())
    writer.producer.flush()
    active_records = writer.records - history_records
    fold_active = fold(spark, settings, fold_records)
    counts_at_snapshot = generator.core.counts()
    end_before_tail = events_end(settings)
    snapshot = latest_snapshot(Warehouse.of(settings), GROUP)
    if snapshot is None or snapshot.offsets != end_before_tail:
        raise RuntimeError(f"the fold did not cover the log: {snapshot and snapshot.offsets}")

    records_before, events_before = writer.records, writer.events
    generator.tail(shape.tail_jobs, time.time())
    writer.close()
    return BuildResult(
        history_records=history_records,
        history_events=history_events,
        generate_s=round(generate_s, 1),
        fold_history=fold_history,
        compact_s=compact_s,
        active_records=active_records,
        fold_active=fold_active,
        tail_records=writer.records - records_before,
        tail_events=writer.events - events_before,
        snapshot_version=snapshot.version,
        snapshot_offsets=snapshot.offsets,
        log_end_before_tail=end_before_tail,
        jobs_files_at_snapshot=jobs_files(settings, snapshot.version),
        counts_at_snapshot=counts_at_snapshot,
        counts_after_tail=generator.core.counts(),
    )


# --- the measurement (in a process of its own) ---------------------------------------------------


class SilentListener:
    """A leader's commit listener with nowhere to deliver to (no hub: nobody is connected)."""

    def committed(self, core: Dispatcher, events: Sequence[Event]) -> None:
        pass

    def stopped(self, error: BaseException | None) -> None:
        pass


@dataclass
class Took:
    wall_s: float = 0.0
    cpu_s: float = 0.0
    """CPU time of this process (all its threads): what the wall time would be on an idle
    machine, for single-threaded work."""


@contextlib.contextmanager
def timed() -> Iterator[Took]:
    took = Took()
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield took
    finally:
        took.wall_s = round(time.perf_counter() - wall, 3)
        took.cpu_s = round(time.process_time() - cpu, 3)


@dataclass
class LeaderRun:
    rebuild_s: float
    """`Leader.rebuild_s`: `start()` from the fence to the `leader_elected` commit."""
    start: Took
    rebuilt_from: str
    replayed_batches: int
    jobs_held: int
    counts: dict[str, int]
    epoch: int


@dataclass
class ReplayRun:
    took: Took
    apply_s: float
    """Wall time inside `apply_all`; the rest is Kafka fetch and decoding."""
    records: int
    events: int
    jobs_held: int


@dataclass
class Measurement:
    leader_runs: list[LeaderRun]
    snapshot_load: Took
    snapshot_jobs: int
    restore: Took
    tail_replay: ReplayRun
    event_log_init: Took
    full_log_replay: ReplayRun
    max_rss_mb: float
    profile: str
    extra: dict[str, Any] = field(default_factory=dict)


def like_a_standby_node() -> None:
    """This process as `dispatch serve` has it before its first term: the modules a node
    imports (and preloads in `Node.start`), and the GC thresholds `dispatch.api.server.serve`
    sets."""
    for module in ("dispatch.api.node", "dispatch.api.server", "dispatch.lease"):
        importlib.import_module(module)
    from dispatch.api.leader import preload_rebuild_modules
    from dispatch.api.server import GC_THRESHOLDS

    preload_rebuild_modules()
    gc.set_threshold(*GC_THRESHOLDS)


def new_leader(settings: Settings, run: int) -> Leader:
    from dispatch.api.leader import Leader
    from dispatch.api.metrics import Metrics

    return Leader(
        settings, f"rebuild-bench-{run}", SilentListener(), Metrics(),
        epoch_for=lambda log_epoch: log_epoch + 1,
        serving_until=lambda: math.inf,
    )  # fmt: skip


def start_leader(settings: Settings, run: int) -> LeaderRun:
    leader = new_leader(settings, run)
    try:
        with timed() as took:
            leader.start()
        assert leader.rebuild_s is not None
        return LeaderRun(
            rebuild_s=round(leader.rebuild_s, 3),
            start=took,
            rebuilt_from=leader.rebuilt_from,
            replayed_batches=leader.replayed_batches,
            jobs_held=len(leader.core),
            counts=leader.core.counts(),
            epoch=leader.core.epoch,
        )
    finally:
        leader.stop()
        del leader
        gc.collect()


def profile_leader_start(settings: Settings, run: int, top: int = 30) -> str:
    """cProfile of one more `Leader.start()`: the functions with the most own time."""
    import cProfile
    import io
    import pstats

    leader = new_leader(settings, run)
    profiler = cProfile.Profile()
    try:
        profiler.runcall(leader.start)
    finally:
        leader.stop()
        del leader
        gc.collect()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def replay_into(core: Dispatcher, settings: Settings, start: dict[int, int] | None) -> ReplayRun:
    """`replay_events` + `apply_all`, as `Leader._replay` does, with the apply time apart."""
    from dispatch.api.kafka_log import replay_events

    apply_s = 0.0
    records = events = 0
    with timed() as took:
        batches = replay_events(
            settings.kafka, client_id="rebuild-bench-replay", start=start, stall_timeout_s=600.0
        )
        for batch in batches:
            records += 1
            if batch.group == GROUP:
                mark = time.perf_counter()
                core.apply_all(batch.events)
                apply_s += time.perf_counter() - mark
                events += len(batch.events)
    return ReplayRun(took, round(apply_s, 3), records, events, len(core))


def time_event_log_init(settings: Settings) -> Took:
    from dispatch.api.kafka_log import EventLog

    with timed() as took:
        event_log = EventLog(settings.kafka, GROUP, client_id="rebuild-bench-fence")
    event_log.close()
    return took


def measure(settings: Settings, repeats: int, profile: bool) -> Measurement:
    """Leader terms first (the process as a new leader finds it), then each step alone."""
    load_average = os.getloadavg()
    like_a_standby_node()  # imports dispatch.delta.snapshot, as a standby has before its term
    from dispatch.delta.snapshot import latest_snapshot

    runs = []
    for run in range(repeats):
        runs.append(start_leader(settings, run))
        print(f"leader term {run + 1}: {runs[-1]}", flush=True)
    profiled = profile_leader_start(settings, repeats) if profile else ""

    config = settings.dispatcher.core_config()
    with timed() as load_took:
        snapshot = latest_snapshot(Warehouse.of(settings), GROUP)
    assert snapshot is not None
    with timed() as restore_took:
        core = Dispatcher.restore(
            snapshot.jobs, config=config, epoch=snapshot.fence_epoch, owned=True
        )
    snapshot_jobs = len(snapshot.jobs)
    offsets = snapshot.offsets
    del snapshot
    tail = replay_into(core, settings, offsets)
    del core
    gc.collect()
    fence_took = time_event_log_init(settings)
    full = replay_into(Dispatcher(config), settings, None)
    gc.collect()
    return Measurement(
        leader_runs=runs,
        snapshot_load=load_took,
        snapshot_jobs=snapshot_jobs,
        restore=restore_took,
        tail_replay=tail,
        event_log_init=fence_took,
        full_log_replay=full,
        max_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0),
        profile=profiled,
        extra={"load_average_at_start": load_average, "load_average_at_end": os.getloadavg()},
    )


def _measure_child(settings: Settings, repeats: int, profile: bool, results: Any) -> None:
    results.put(asdict(measure(settings, repeats, profile)))


def measure_in_fresh_process(settings: Settings, repeats: int, profile: bool) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_measure_child, args=(settings, repeats, profile, results))
    child.start()
    try:
        measured: dict[str, Any] = results.get(timeout=3600)
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
            child.join()
    return measured


# --- main --------------------------------------------------------------------------------------


def bench_settings(base: Settings, scratch: Path) -> Settings:
    """The stack's settings with topics and folders of this run (`with_namespace`)."""
    from dispatch.bench.streaming_bench import with_namespace

    settings = with_namespace(base, "rebuild", scratch)
    auth = settings.auth.model_copy(
        update={"keys_file": scratch / "keys.json", "dev_keys_file": scratch / "dev-keys.json"}
    )
    return settings.model_copy(update={"auth": auth})


@contextlib.contextmanager
def spark_for(settings: Settings) -> Iterator[SparkSession]:
    from dispatch.streaming.session import spark_session

    spark = spark_session(settings, "dispatch-rebuild-bench")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


def run_rebuild_bench(
    shape: Shape, *, fold_records: int, repeats: int, profile: bool
) -> dict[str, Any]:
    from dispatch.bench.streaming_bench import stack

    results: dict[str, Any] = {"shape": asdict(shape), "machine_cores": multiprocessing.cpu_count()}
    with (
        tempfile.TemporaryDirectory(prefix="dispatch-rebuild-bench-") as scratch,
        stack(Path(scratch) / "stack") as base,
    ):
        settings = bench_settings(base, Path(scratch))
        with spark_for(settings) as spark:
            built = build(spark, settings, shape, fold_records)
        results["build"] = asdict(built)
        print(json.dumps(results["build"], indent=1), flush=True)
        gc.collect()
        results["measure"] = measure_in_fresh_process(settings, repeats, profile)
        print(json.dumps(results["measure"], indent=1), flush=True)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Shape()
    parser.add_argument("--history", type=int, default=defaults.history, help="finished jobs")
    parser.add_argument("--queued", type=int, default=defaults.queued)
    parser.add_argument("--running", type=int, default=defaults.running)
    parser.add_argument("--tail-jobs", type=int, default=defaults.tail_jobs)
    parser.add_argument(
        "--history-rate", type=float, default=defaults.rate, help="simulated jobs/s"
    )
    parser.add_argument("--fold-records", type=int, default=5000, help="records per fold batch")
    parser.add_argument("--repeats", type=int, default=3, help="leader terms started")
    parser.add_argument(
        "--no-profile", action="store_true", help="no cProfile of an extra leader start"
    )


def shape_of(args: argparse.Namespace) -> Shape:
    return Shape(args.history, args.queued, args.running, args.tail_jobs, args.history_rate)


def show_fold_progress() -> None:
    """The fold's one line per batch (records, events, seconds) on stderr."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("dispatch.streaming.batch").setLevel(logging.INFO)
    logging.getLogger("kafka").setLevel(logging.ERROR)  # "task ran for 0.1 s" on a busy machine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch.bench.rebuild_bench", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    parser.add_argument("--out", type=Path, help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    show_fold_progress()
    results = run_rebuild_bench(
        shape_of(args),
        fold_records=args.fold_records,
        repeats=args.repeats,
        profile=not args.no_profile,
    )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Streaming benchmark: freshness of the Delta tables, and MERGE cost against history size.

    .venv/bin/python -m bench.streaming_bench                       # both parts
    .venv/bin/python -m bench.streaming_bench --skip-merge --rate 1000 --duration 120
    .venv/bin/python -m bench.streaming_bench --skip-freshness --history 10000,100000,1000000

Everything runs on a temporary broker (free ports) and a temporary warehouse.

**Freshness.** A leader emulator (a process of its own, so it does not share this process's
GIL) runs the pure dispatcher core at `--rate` jobs/s: every 10 ms it submits the jobs due by
then (job i is due i / rate after its start, so a late tick catches up), assigns them to
workers and acks those assigned `--run-s` ago, and writes what that tick decided to
`dispatch.events` (one record, or several of at most 4 MiB each when the tick is large, in
order, without a transaction), plus one `dispatch.submit` record per job. Its core's cap on
jobs in flight per client (5 clients) is twice what `--rate` keeps in flight even with ticks
30 s late, and every worker gets credit for the whole rate for as long, so neither limits the
rate: what it submits, it assigns and completes. The streaming application runs in this
process with its production options. Afterwards the events topic is read back: an event is
visible in `jobs` when the first `jobs` commit whose recorded offsets cover its record is
committed, so freshness = that commit's timestamp - the event's `at` (same clock).

The measured run (after `--warmup`) is cut into 10 s windows, each with the jobs submitted
(`enqueued`), assigned and completed per second, counted from the events read back, the
freshness of its events, the emulator's worst lag (how long after its due time a job was
submitted) and how long its records took to be acknowledged. The result states the rate asked
for and the rate measured (submitted/s over the run), and names every shortfall and who could
not keep up: the emulator, when submitted/s falls more than 5% below the rate asked, assigned
or completed/s more than 5% below submitted/s, or its lag or its records' wait passes 1 s;
the fold, when it needs more than 10 s after the emulator stopped to read the rest, or its
freshness grew over the run.

**MERGE cost.** For each history size H, a fresh `jobs` table gets H finished jobs (bulk
written, then compacted, as a long-running table would be) and a backlog of queued jobs; then
identical batches (N new jobs submitted, N jobs assigned and acked, so every batch inserts,
updates and moves rows) go through `BatchWriter` one by one, and the per-step times are
recorded. The first batch after the bulk load is a warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import multiprocessing
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

from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import MAX_CREDITS, Dispatcher
from dispatch.core.events import Assigned, Completed, Enqueued, Event
from dispatch.event_records import MAX_RECORD_BYTES, encode_batch, encode_batches
from dispatch.settings import Settings, load_settings
from dispatch.settings import with_namespace as namespace_settings
from dispatch.stack.broker import TOPIC_MAX_MESSAGE_BYTES, Broker, create_topics
from dispatch.stack.ports import free_port
from dispatch.submit_records import submit_record_value

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

GROUP = "default"
TICK_S = 0.01
EXECS = ("image.resize", "image.crop", "text.index", "mail.send")
CLIENTS = 5
WORKERS = 8
CREDIT_EVERY_S = 1.0
WINDOW_S = 10.0
KEEP_UP = 0.95
"""A measured rate more than 5% below the one it should equal is a shortfall."""
LAG_SLACK_S = 30.0
"""How far behind schedule the emulator may fall before its cap or credit could bind."""
EMULATOR_LATE_S = 1.0
"""An emulator lag (or a wait for the broker's acknowledgement) beyond this is reported."""
FOLD_CATCH_UP_S = 10.0
"""A fold that keeps up reads the rest within a few batches after the load stops."""
CATCH_UP_WAIT_S = 120.0

RECORD_MAX_BYTES = MAX_RECORD_BYTES
"""What the leader aims at per events record (a tick of a late emulator can hold megabytes)."""
PRODUCER: dict[str, Any] = {
    "acks": "all",
    # Idempotence keeps a tick's records in order through retries, which is all the fold
    # needs of records written without a transaction.
    "enable_idempotence": True,
    "linger_ms": 5,
    "batch_size": 256 * 1024,
    # kafka-python refuses records over 1 MiB by default; the topics take 16 MiB.
    "max_request_size": TOPIC_MAX_MESSAGE_BYTES,
}


# --- the leader emulator ---------------------------------------------------------------------


def in_flight_cap(rate: float, run_s: float, clients: int = CLIENTS) -> int:
    """A per-client cap that never limits `rate`: twice the jobs a client keeps in flight at
    that rate, counting `LAG_SLACK_S` more than `run_s`, since a late tick acks late too (a
    late emulator is reported as such, not hidden behind its cap)."""
    return max(1, math.ceil(2 * rate * (run_s + LAG_SLACK_S) / clients))


def worker_credit(rate: float) -> int:
    """Credit per worker per grant: each worker alone could take the whole rate until the
    next grant, however late it comes (within `LAG_SLACK_S`), so credit never limits it."""
    return min(MAX_CREDITS, max(1, math.ceil(rate * (CREDIT_EVERY_S + LAG_SLACK_S))))


class Emulator:
    """The pure core driven like the leader drives it, one tick at a time."""

    def __init__(
        self, workers: int = WORKERS, prefix: str = "job", *, cap: int | None = None
    ) -> None:
        config = CoreConfig(ack_timeout_s=600.0, max_ack_timeout_s=600.0, worker_expiry_s=None)
        if cap is not None:
            config = dataclasses.replace(config, default_cap=cap)
        self.core = Dispatcher(config)
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
                    client_id=f"client-{index % CLIENTS}",
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


class Load:
    """What the leader emulator decides at `rate` jobs/s from `started` on, tick by tick (the
    clock is the caller's, so tests can drive it)."""

    def __init__(self, rate: float, run_s: float, started: float) -> None:
        self.rate = rate
        self.run_s = run_s
        self.started = started
        self.cap = in_flight_cap(rate, run_s)
        self.credit = worker_credit(rate)
        self.emulator = Emulator(cap=self.cap)
        self.submitted = 0
        self.next_credit = started
        self.lag_s = 0.0
        """How long after its due time the oldest job of the last step was submitted."""

    def start(self) -> list[Event]:
        return self.emulator.start(self.started)

    def step(self, now: float) -> tuple[list[SubmitRequest], list[Event]]:
        """The jobs due by `now` and the events of submitting them, of fresh credit (every
        `CREDIT_EVERY_S`) and of the acks due."""
        events: list[Event] = []
        if now >= self.next_credit:
            events += self.emulator.credit(now, self.credit)
            self.next_credit = now + CREDIT_EVERY_S
        due = int((now - self.started) * self.rate) - self.submitted
        first_due = self.started + (self.submitted + 1) / self.rate
        self.lag_s = max(0.0, now - first_due) if due > 0 else 0.0
        requests = self.emulator.requests(max(0, due))
        self.submitted += len(requests)
        events += self.emulator.tick(now, requests, now - self.run_s)
        return requests, events


def tick_records(events: Sequence[Event], max_bytes: int = RECORD_MAX_BYTES) -> list[bytes]:
    """A tick's events as `dispatch.events` records of at most `max_bytes` each, in order."""
    return encode_batches(GROUP, 1, events, max_bytes)


def emulate_leader(
    bootstrap: str,
    submit_topic: str,
    events_topic: str,
    rate: float,
    run_s: float,
    duration_s: float,
    stats_path: str,
) -> None:
    """The leader emulator's process: `rate` jobs/s for `duration_s`, as described above; its
    own timings go to `stats_path` (JSON) at the end."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, **PRODUCER)
    load = Load(rate, run_s, time.time())
    ticks: list[tuple[float, float, float]] = []
    """(tick time, lag, busy seconds) of every tick."""
    written: list[tuple[float, float]] = []
    """(tick time, seconds until the broker acknowledged the tick's last events record)."""

    def write(events: list[Event], now: float) -> None:
        for record in tick_records(events):
            future = producer.send(events_topic, key=GROUP.encode(), value=record)
        future.add_callback(lambda _: written.append((now, time.time() - now)))

    write(load.start(), load.started)
    while True:
        now = time.time()
        if now - load.started >= duration_s:
            break
        requests, events = load.step(now)
        for request in requests:
            producer.send(submit_topic, key=request.id.encode(), value=submit_record_value(request))
        if events:
            write(events, now)
        busy = time.time() - now
        ticks.append((now, load.lag_s, busy))
        time.sleep(max(0.0, TICK_S - busy))
    producer.flush()
    producer.close()
    stats = {
        "started": load.started,
        "cap_per_client": load.cap,
        "credit_per_worker": load.credit,
        "ticks": ticks,
        "written": written,
    }
    Path(stats_path).write_text(json.dumps(stats))


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

COUNTED = {Enqueued.type: "submitted", Assigned.type: "assigned", Completed.type: "completed"}
"""The event types counted, and what they count."""

SeenEvent = tuple[str, float, float | None]
"""(type, at, when it became visible in `jobs`, None if never) of one job event."""


@dataclass
class Window:
    """One window of the measured run."""

    start_s: float
    """From the start of the measured run."""
    length_s: float
    jobs: dict[str, int]
    """Jobs submitted, assigned and completed in the window."""
    submitted_per_s: float
    assigned_per_s: float
    completed_per_s: float
    freshness_s: dict[str, float]
    """Of the job events of the window (by their `at`)."""
    not_visible: int
    """Job events of the window no `jobs` commit covered."""
    emulator_lag_max_s: float = 0.0
    """The longest a job of the window waited past its due time to be submitted."""
    write_p95_s: float = 0.0
    """How long the emulator's events records of the window took to be acknowledged."""


def windows_of(
    events: Iterable[SeenEvent], start: float, end: float, window_s: float = WINDOW_S
) -> list[Window]:
    """The job events with `start <= at < end`, counted and measured per `window_s` (the last
    window may be shorter)."""
    count = max(1, math.ceil((end - start) / window_s))
    counts: Counter[tuple[int, str]] = Counter()
    samples: list[list[float]] = [[] for _ in range(count)]
    hidden = [0] * count
    for kind, at, visible in events:
        if not start <= at < end:
            continue
        index = min(count - 1, int((at - start) // window_s))
        name = COUNTED.get(kind)
        if name is not None:
            counts[index, name] += 1
        if visible is None:
            hidden[index] += 1
        else:
            samples[index].append(visible - at)
    out = []
    for index in range(count):
        length = min(window_s, end - start - index * window_s)
        jobs = {name: counts[index, name] for name in COUNTED.values()}
        per_s = {name: round(n / length, 1) for name, n in jobs.items()}
        out.append(
            Window(
                start_s=index * window_s,
                length_s=round(length, 3),
                jobs=jobs,
                submitted_per_s=per_s["submitted"],
                assigned_per_s=per_s["assigned"],
                completed_per_s=per_s["completed"],
                freshness_s=percentiles(samples[index]),
                not_visible=hidden[index],
            )
        )
    return out


def add_emulator_lag(
    windows: list[Window],
    ticks: Sequence[Sequence[float]],
    written: Sequence[Sequence[float]],
    start: float,
) -> None:
    """Each window's worst emulator lag and p95 write time, from the emulator's stats."""
    for window in windows:
        begin, end = start + window.start_s, start + window.start_s + window.length_s
        lags = [tick[1] for tick in ticks if begin <= tick[0] < end]
        writes = [item[1] for item in written if begin <= item[0] < end]
        window.emulator_lag_max_s = round(max(lags, default=0.0), 3)
        window.write_p95_s = percentiles(writes).get("p95", 0.0)


def shortfalls(
    rate_asked: float,
    submitted_per_s: float,
    assigned_per_s: float,
    completed_per_s: float,
    windows: Sequence[Window],
    emulator_lag_max_s: float,
    emulator_write_p95_s: float,
    fold_catch_up_s: float | None,
) -> list[str]:
    """Every way the run fell short of the rate asked for, each saying who could not keep
    up; [] when none did."""
    out = []
    emulator = "the emulator could not keep up"
    late = emulator_lag_max_s > EMULATOR_LATE_S
    if submitted_per_s < KEEP_UP * rate_asked:
        out.append(f"submitted {submitted_per_s:.0f}/s < {rate_asked:.0f}/s asked: {emulator}")
    if late:
        out.append(
            f"{emulator}: jobs were submitted up to {emulator_lag_max_s:.2f} s after their "
            "due time (the load came in bursts, the acks late)"
        )
    if emulator_write_p95_s > EMULATOR_LATE_S:
        out.append(
            f"{emulator}: its records took {emulator_write_p95_s:.2f} s (p95) to reach the "
            "broker, and freshness includes that wait"
        )
    for name, value in (("assigned", assigned_per_s), ("completed", completed_per_s)):
        if value < KEEP_UP * submitted_per_s:
            why = "its ticks fell behind" if late else "its core's cap or credit limited it"
            out.append(
                f"{name} {value:.0f}/s < {submitted_per_s:.0f}/s submitted: {emulator} ({why})"
            )
    short = [
        f"{w.start_s:g} s"
        for w in windows
        if min(w.assigned_per_s, w.completed_per_s) < KEEP_UP * w.submitted_per_s
    ]
    if short:
        out.append(
            f"windows where assigned or completed/s < 95% of submitted/s: {', '.join(short)}"
        )
    if fold_catch_up_s is None or fold_catch_up_s > FOLD_CATCH_UP_S:
        needed = f"over {CATCH_UP_WAIT_S:g}" if fold_catch_up_s is None else f"{fold_catch_up_s:g}"
        out.append(
            f"the fold could not keep up: it needed {needed} s after the emulator stopped to "
            "read the rest"
        )
    measured = [w.freshness_s["p50"] for w in windows if w.freshness_s]
    if len(measured) >= 2 and measured[-1] > 2 * measured[0] + 1.0:
        out.append(
            f"the fold fell behind: freshness p50 grew from {measured[0]:.2f} s (first "
            f"window) to {measured[-1]:.2f} s (last)"
        )
    return out


@dataclass
class FreshnessResult:
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
) -> FreshnessResult:
    from streaming.app import StreamOptions, start
    from streaming.lag import streaming_lag
    from streaming.maintenance import MaintenancePolicy

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
    options = StreamOptions(maintenance=MaintenancePolicy(optimize_every_s=optimize_every_s))
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
        read_events(settings), commits_of(settings.paths.warehouse, kafka.events_topic)
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
        f"freshness run: {r.rate_asked:,.0f} jobs/s asked; measured {r.rate_measured:,.1f} "
        f"submitted/s, {r.assigned_per_s:,.1f} assigned/s, {r.completed_per_s:,.1f} completed/s "
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
        f"fold: {r.batches} batches, p50 {r.batch_s.get('p50')} s, p95 {r.batch_s.get('p95')} s, "
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
    parser.add_argument("--run-s", type=float, default=1.0, help="seconds each job runs")
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
                    spark,
                    settings,
                    args.rate,
                    args.duration,
                    args.warmup,
                    args.optimize_every,
                    args.run_s,
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
        finally:
            spark.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

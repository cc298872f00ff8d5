"""Chaos run: a known job mix at a steady rate through a real stack while faults are injected,
then Jepsen-style safety counts and liveness figures.

    .venv/bin/python -m dispatch.bench.chaos                 # 6,000 jobs at 150/s, tables
    .venv/bin/python -m dispatch.bench.chaos --jobs 300 --rate 20 --faults leader,worker \
        --out out.json                                       # tables, and the JSON in a file
    .venv/bin/python -m dispatch.bench.chaos --json          # the JSON on stdout, no tables

**The stack.** `LocalStack` (broker, topics, streaming fold, two API nodes) in a temporary
folder on free ports (`dispatch.bench.harness.running_stack`), plus `--workers` worker processes of
`dispatch.bench.chaos_worker` (WebSocket SDK workers, `--slots` each) that write every attempt they
run to a file: the worker side of the counts.

**The load.** `--jobs` planned jobs, `--rate` per second, in a batch every 100 ms (open loop):
successes, retryable failures (succeed on attempt 2), permanent failures (dead-lettered),
stalls (time out twice, dead-lettered), duplicates (an earlier id again), raw Kafka records
produced to `dispatch.submit`, and malformed raw records (must reach
`dispatch.submit.rejected`). REST batches go through the SDK's `Client` with both nodes.

**The faults** (`--faults`, in order, spread evenly over the load; one may slide when the
previous one took longer): `broker` (kill -9, down `--broker-down` s, restart), `leader`
(kill -9 the node whose /readyz is 200, restart it once another leads), `worker` (kill -9 one
worker process, restart it), `pause` (SIGSTOP the leader `--pause` s, past its lease, then
SIGCONT), `streaming` (kill -9 the fold's process group, restart it). Right after each fault a
canary job (priority 1000) is submitted and timed to its end.

**The counts**, once every accepted job ended (or `--settle-timeout`): the API's status of
every job, the whole `dispatch.events` log (read_committed, with record times), the
`dispatch.submit.rejected` topic, the workers' run files, and the Delta `jobs` table (read with
delta-rs once the fold covered the log's end). Safety: lost, unexpected, completed twice (in
the log), run to success twice (worker side, not explained by a worker kill), wrong terminal
state, deposed-epoch writes, Delta vs API disagreements, malformed records not rejected.
Liveness per fault: kill -> first new completion in the log, kill -> first accepted
submission, the canary's time to finish; and worker slot overruns. Exit 1 on any safety count
above 0, a fault the stack never recovered from (a fold that exits after its restart ends the
waits at once rather than at their timeouts), or a canary slower than 10 s (or unfinished)
after a plain kill (leader, worker, streaming).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from dispatch.bench.chaos_audit import (
    DEFAULT_FAULTS,
    FAULT_KINDS,
    TERMINAL,
    FaultRecord,
    LogRecord,
    PlannedJob,
    audit_log,
    audit_runs,
    disagreements,
    expected_status,
    fault_times,
    first_after,
    job_mix,
    lost_jobs,
    outage_windows,
    parse_faults,
    ran_across_an_outage,
    unexpected_jobs,
    verdict,
    wrong_states,
)
from dispatch.bench.harness import (
    cluster_profile_settings,
    find_leader,
    kill_9,
    running_record,
    running_stack,
    stack_settings,
)
from dispatch.bench.harness_load import LoadThreads
from dispatch.bench.signals import unwinds_on_sigterm
from dispatch.event_records import decode_batch
from dispatch.settings import Settings, to_environment
from dispatch.stack.local import DISPATCH, ApiNode, LocalStack
from dispatch.stack.process import ManagedProcess
from dispatch.warehouse import Warehouse

CANARY_PRIORITY = 1000
BATCH_EVERY_S = 0.1
WORKER_APP = "dispatch.bench.chaos_worker:app"

# --- the load ------------------------------------------------------------------------------------


class Load(LoadThreads):
    """The planned jobs at `rate`/s: REST batches through the SDK, raw records to Kafka."""

    join_s = 120.0

    def __init__(
        self, planned: Sequence[PlannedJob], urls: Sequence[str], key: str, rate: float,
        settings: Settings,
    ) -> None:  # fmt: skip
        super().__init__()
        self.planned, self.urls, self.key, self.rate = list(planned), list(urls), key, rate
        self.settings = settings
        self.accepted: set[str] = set()
        self.malformed_acked: set[str] = set()
        self.accept_times: list[float] = []
        self.failed_batches = 0
        self.failed_records = 0
        self.errors: Counter[str] = Counter()
        self.thread = self.add_thread(self._run, "chaos-load")

    def done(self) -> bool:
        return not self.thread.is_alive()

    def _run(self) -> None:
        from kafka import KafkaProducer

        from dispatch.client import Client

        per_batch = max(1, round(self.rate * BATCH_EVERY_S))
        producer = KafkaProducer(
            bootstrap_servers=self.settings.kafka.bootstrap, acks="all", retries=5,
            max_block_ms=20_000, request_timeout_ms=20_000, client_id="chaos-load",
        )  # fmt: skip
        started = time.monotonic()
        try:
            with Client(self.urls, api_key=self.key, retry_timeout_s=30.0) as client:
                for batch, offset in enumerate(range(0, len(self.planned), per_batch), start=1):
                    if self.stop.is_set():
                        return
                    chunk = self.planned[offset : offset + per_batch]
                    self._rest(client, [job for job in chunk if not job.via_kafka])
                    self._kafka(producer, [job for job in chunk if job.via_kafka])
                    # Open loop: batch k leaves at k * 100 ms (a late one is caught up at once).
                    pause = started + batch * BATCH_EVERY_S - time.monotonic()
                    self.stop.wait(max(0.0, pause))
        finally:
            producer.close(timeout=10)

    def _rest(self, client: Any, jobs: list[PlannedJob]) -> None:
        from dispatch.client import DispatchError

        if not jobs:
            return
        try:
            answers = client.submit_many([job.body() for job in jobs], batch_size=len(jobs))
        except DispatchError as error:
            self.failed_batches += 1
            self.errors[f"rest {type(error).__name__}: {str(error)[:80]}"] += 1
            return
        self.accepted.update(answer.id for answer in answers)
        self.accept_times.append(time.time())

    def _kafka(self, producer: Any, jobs: list[PlannedJob]) -> None:
        from kafka.errors import KafkaError

        topic = self.settings.kafka.submit_topic
        for job in jobs:
            value = job.raw if job.raw is not None else json.dumps(job.body()).encode()
            try:
                producer.send(topic, key=job.id.encode(), value=value).get(timeout=20)
            except KafkaError as error:
                self.failed_records += 1
                self.errors[f"kafka {type(error).__name__}"] += 1
                continue
            if job.kind == "malformed":
                self.malformed_acked.add(job.id)
            else:
                self.accepted.add(job.id)
                self.accept_times.append(time.time())


# --- the workers ---------------------------------------------------------------------------------


class WorkerFleet:
    """`count` processes of `dispatch.bench.chaos_worker`, each a managed process (pid file)."""

    def __init__(
        self, settings: Settings, urls: Sequence[str], key: str, count: int, slots: int,
        record_dir: Path,
    ) -> None:  # fmt: skip
        run_dir, logs = settings.paths.var / "run", settings.paths.var / "logs"
        self.slots = slots
        self.record_dir = record_dir
        self.environment = {
            **os.environ, **to_environment(settings), "DISPATCH_URL": ",".join(urls),
            "DISPATCH_API_KEY": key, "CHAOS_RECORD_DIR": str(record_dir),
            "CHAOS_SLOTS": str(slots),
        }  # fmt: skip
        self.processes = [
            ManagedProcess(f"chaos-worker-{n}", run_dir, logs / f"chaos-worker-{n}.log")
            for n in range(1, count + 1)
        ]
        self.killed: dict[int, float] = {}

    def start_missing(self) -> None:
        argv = [DISPATCH, "worker", "--app", WORKER_APP, "--concurrency", str(self.slots)]
        for process in self.processes:
            if process.record() is None:
                process.start(argv, env=self.environment)

    def kill_9(self, number: int) -> int:
        process = self.processes[number % len(self.processes)]
        record = running_record(process)
        self.killed[record.pid] = time.time()
        kill_9(process)
        return record.pid

    def stop(self) -> None:
        for process in self.processes:
            process.stop(timeout_s=10.0)

    def runs(self) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        for path in sorted(self.record_dir.glob("runs-*.jsonl")):
            for text in path.read_text().splitlines():
                with contextlib.suppress(ValueError):  # a line cut by kill -9
                    lines.append(json.loads(text))
        return lines

    def exited(self) -> dict[str, str]:
        """Workers not running now (none was killed without a restart): name -> the last
        line of its log."""
        return {
            process.name: process.log_tail(1)
            for process in self.processes
            if process.record() is None
        }

    def slot_warnings(self) -> int:
        count = 0
        for process in self.processes:
            if process.log_file.exists():
                count += process.log_file.read_text(errors="replace").count("more jobs than slots")
        return count


# --- the faults ----------------------------------------------------------------------------------


@dataclass
class ChaosOptions:
    jobs: int = 6000
    rate: float = 150.0
    faults: tuple[str, ...] = DEFAULT_FAULTS
    seed: int = 1
    workers: int = 2
    slots: int = 8
    pause_s: float = 6.0
    broker_down_s: float = 3.0
    gap_s: float = 5.0
    """The least time between the end of one fault (its component back) and the next."""
    settle_timeout_s: float = 300.0
    delta_timeout_s: float = 300.0
    scratch: Path | None = None
    """Keep the stack's folder here (logs, run files) instead of a temporary one."""
    profile: str = ""
    """`cluster`: the stack of conf/profiles/cluster.toml (3 brokers, the object store, a
    Spark cluster with one worker, 3 API nodes) on free ports; "": the default stack."""


class Chaos:
    """One run: the stack, the fleet, the load and the faults."""

    def __init__(self, options: ChaosOptions, settings: Settings, stack: LocalStack) -> None:
        from dispatch.auth import ensure_dev_keys

        self.options, self.settings, self.stack = options, settings, stack
        self.keys = ensure_dev_keys(settings.auth)
        self.urls = [node.url for node in stack.nodes]
        self.http = httpx.Client(timeout=5.0)
        self.canaries: list[threading.Thread] = []

    # the leader
    def leader(self, timeout_s: float = 90.0) -> tuple[ApiNode, int]:
        return find_leader(self.http, self.stack.nodes, timeout_s)

    def inject(self, number: int, kind: str, started: float, fleet: WorkerFleet) -> FaultRecord:
        injector = {
            "broker": self._broker, "leader": self._leader, "worker": self._worker,
            "pause": self._pause, "streaming": self._streaming,
        }[kind]  # fmt: skip
        return injector(number, started, fleet)

    def _record(self, kind: str, started: float, target: str, number: int) -> FaultRecord:
        now = time.time()
        fault = FaultRecord(kind, round(time.monotonic() - started, 2), now, target)
        fault.canary_id = f"chaos-canary-{self.options.seed}-{number}"
        return fault

    def _canary(self, fault: FaultRecord) -> None:
        """Submit the canary now and time it to its end, in a thread of its own."""

        def run() -> None:
            from dispatch.client import Client, DispatchError

            began = time.monotonic()
            try:
                with Client(self.urls, api_key=self.keys["client"], retry_timeout_s=120.0) as c:
                    c.submit("chaos.ok", {"ms": 1}, id=fault.canary_id, priority=CANARY_PRIORITY)
                    job = c.wait(fault.canary_id, timeout_s=180.0, poll_s=5.0)
                fault.canary_status = job.status
                fault.canary_s = round(time.monotonic() - began, 3)
            except DispatchError as error:
                fault.canary_status = f"error: {type(error).__name__}: {str(error)[:100]}"

        thread = threading.Thread(target=run, name=f"canary-{fault.canary_id}", daemon=True)
        thread.start()
        self.canaries.append(thread)

    def _broker(self, number: int, started: float, _fleet: WorkerFleet) -> FaultRecord:
        record = running_record(self.stack.broker.process)
        fault = self._record("broker", started, f"pid {record.pid}", number)
        kill_9(self.stack.broker.process)
        self._canary(fault)
        time.sleep(self.options.broker_down_s)
        self.stack.broker.start()  # returns once the broker answers metadata requests
        fault.answering_at = time.time()
        fault.recovered_s = round(fault.answering_at - fault.killed_at, 3)
        self.stack.up()  # anything that died with the broker
        fault.note = f"down {self.options.broker_down_s:.0f} s before the restart"
        return fault

    def _leader(self, number: int, started: float, _fleet: WorkerFleet) -> FaultRecord:
        node, epoch = self.leader()
        fault = self._record("leader", started, f"{node.url} epoch {epoch}", number)
        kill_9(node.process)
        self._canary(fault)
        self.leader()
        fault.recovered_s = round(time.time() - fault.killed_at, 3)
        self.stack.up()  # the killed node again, as a standby
        return fault

    def _pause(self, number: int, started: float, _fleet: WorkerFleet) -> FaultRecord:
        node, epoch = self.leader()
        record = node.process.record()
        if record is None:
            raise RuntimeError(f"{node.url}: no process")
        fault = self._record("pause", started, f"{node.url} epoch {epoch}", number)
        os.kill(record.pid, signal.SIGSTOP)
        try:
            self._canary(fault)
            time.sleep(self.options.pause_s)
        finally:
            os.kill(record.pid, signal.SIGCONT)
        self.leader()
        fault.recovered_s = round(time.time() - fault.killed_at, 3)
        fault.note = f"SIGSTOP {self.options.pause_s:.0f} s, then SIGCONT"
        return fault

    def _worker(self, number: int, started: float, fleet: WorkerFleet) -> FaultRecord:
        victim = sum(1 for kind in self.options.faults[:number] if kind == "worker")
        fault = self._record(
            "worker", started, fleet.processes[victim % len(fleet.processes)].name, number
        )
        pid = fleet.kill_9(victim)
        fault.killed_at = fleet.killed[pid]
        fault.target += f" pid {pid}"
        self._canary(fault)
        fleet.start_missing()
        fault.recovered_s = round(time.time() - fault.killed_at, 3)
        return fault

    def _streaming(self, number: int, started: float, _fleet: WorkerFleet) -> FaultRecord:
        from dispatch.delta import tables as t
        from dispatch.delta.progress import latest_progress

        record = running_record(self.stack.streaming)
        warehouse = Warehouse.of(self.settings)
        before = latest_progress(warehouse, t.JOBS)
        fault = self._record("streaming", started, f"pid {record.pid}", number)
        kill_9(self.stack.streaming, group=True)  # the driver and its JVM
        self._canary(fault)
        # Only the fold died: start it again at once (`up` would first walk every other
        # component and wait for a leader).
        self.stack.restart("streaming")
        deadline = time.monotonic() + self.options.delta_timeout_s
        fault.note = "recovered = the fold's next jobs commit"
        while time.monotonic() < deadline:
            now = latest_progress(warehouse, t.JOBS)
            if now is not None and (before is None or now.version > before.version):
                fault.recovered_s = round(time.time() - fault.killed_at, 3)
                break
            code = self.stack.streaming.exit_code()
            if code is not None:
                # Dead again: waiting out the timeout would only hide it for minutes.
                fault.note = f"the restarted fold exited with code {code}: logs/streaming.log"
                break
            time.sleep(DELTA_POLL_S)
        return fault

    def join_canaries(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self.canaries:
            thread.join(max(0.0, deadline - time.monotonic()))


# --- reading the outcome -------------------------------------------------------------------------


def read_topic(settings: Settings, topic: str, timeout_s: float = 60.0) -> Iterator[Any]:
    """Every committed record of `topic`, from its beginning to its end now."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap, group_id=None, enable_auto_commit=False,
        isolation_level="read_committed", auto_offset_reset="earliest",
        client_id="chaos-audit", max_poll_records=2000,
    )  # fmt: skip
    try:
        partitions = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(p) < end[p] for p in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: not at its end after {timeout_s:.0f} s")
            for batch in consumer.poll(timeout_ms=500).values():
                deadline = time.monotonic() + timeout_s
                yield from batch
    finally:
        consumer.close()


def events_log(settings: Settings) -> tuple[list[LogRecord], dict[int, int]]:
    """The group's batches of `dispatch.events`, and per partition the offset after its last
    record (a transaction's commit marker takes an offset too, so the end offsets Kafka
    reports lie beyond what any reader, the fold included, can say it consumed)."""
    records = []
    after_last: dict[int, int] = {}
    for record in read_topic(settings, settings.kafka.events_topic):
        after_last[record.partition] = record.offset + 1
        if record.value is None:
            continue
        batch = decode_batch(record.value)
        if batch.group == settings.dispatcher.group:
            records.append(LogRecord(record.timestamp / 1000, batch.epoch, batch.events))
    return records, after_last


def rejected_keys(settings: Settings) -> set[str]:
    from dispatch.submit_records import Rejection

    keys = set()
    for record in read_topic(settings, settings.kafka.rejected_topic):
        with contextlib.suppress(ValueError, KeyError):
            rejection = Rejection.from_record_value(record.value)
            if rejection.key is not None:
                keys.add(rejection.key.decode(errors="replace"))
    return keys


def api_statuses(urls: Sequence[str], key: str, ids: Iterable[str]) -> dict[str, str | None]:
    """Each job's status as the leader answers it (None: not found)."""
    from dispatch.client import Client, NotFound

    with Client(urls, api_key=key, retry_timeout_s=60.0) as client:

        def status(job_id: str) -> tuple[str, str | None]:
            try:
                return job_id, client.get(job_id).status
            except NotFound:
                return job_id, None

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            return dict(pool.map(status, sorted(set(ids))))


def wait_terminal(
    urls: Sequence[str], key: str, ids: Iterable[str], timeout_s: float
) -> tuple[dict[str, str | None], float]:
    """Until every id is terminal (or `timeout_s`): the statuses, and the seconds waited."""
    started = time.monotonic()
    statuses = api_statuses(urls, key, ids)
    while time.monotonic() - started < timeout_s:
        pending = [job_id for job_id, status in statuses.items() if status not in TERMINAL]
        if not pending:
            break
        time.sleep(SETTLE_POLL_S)
        statuses.update(api_statuses(urls, key, pending))
    return statuses, round(time.monotonic() - started, 1)


JOBS_MERGE_GRACE_S = 5.0
"""After `events` covers the log, the batch's `jobs` MERGE (its last commit) is this close."""
DELTA_POLL_S = 0.5
"""How often the tables' progress is read while waiting for the fold (a read of the Delta
log: cheap beside a micro-batch)."""
SETTLE_POLL_S = 1.0
"""How often the statuses of the jobs not yet ended are asked again."""


def delta_statuses(
    settings: Settings,
    log_end: Mapping[int, int],
    timeout_s: float,
    fold_exit_code: Callable[[], int | None] = lambda: None,
) -> dict[str, str] | None:
    """The `jobs` table's status per id once the fold covered `log_end` (events partition ->
    the offset after the last record read); None when it did not within `timeout_s`, or
    when the fold's process has exited (`fold_exit_code`) before it did.

    Covered: `jobs` records it, or `events` does and the grace for that batch's `jobs` MERGE
    passed (a batch that changed no job may leave no `jobs` commit)."""
    from dispatch.delta import tables as t
    from dispatch.delta.progress import latest_progress

    topic = settings.kafka.events_topic
    warehouse = Warehouse.of(settings)

    def covers(table: str) -> bool:
        progress = latest_progress(warehouse, table)
        covered = progress.progress.offsets.get(topic, {}) if progress else {}
        return all(covered.get(partition, 0) >= offset for partition, offset in log_end.items())

    deadline = time.monotonic() + timeout_s
    while not covers(t.JOBS):
        if covers(t.EVENTS):
            # The batch's `jobs` MERGE comes after its `events` append: wait for it, but no
            # longer than the grace (a batch that changed no job may leave no `jobs` commit).
            grace_ends = time.monotonic() + JOBS_MERGE_GRACE_S
            while not covers(t.JOBS) and time.monotonic() < grace_ends:
                time.sleep(DELTA_POLL_S)
            break
        if time.monotonic() > deadline or fold_exit_code() is not None:
            return None
        time.sleep(DELTA_POLL_S)
    rows = warehouse.open(t.JOBS).to_pyarrow_table(columns=["dispatch_group", "id", "status"])
    return {
        row["id"]: row["status"]
        for row in rows.to_pylist()
        if row["dispatch_group"] == settings.dispatcher.group
    }


# --- the run -------------------------------------------------------------------------------------


@dataclass
class ChaosResult:
    options: dict[str, Any]
    safety: dict[str, int | None]
    examples: dict[str, list[str]]
    faults: list[FaultRecord]
    liveness: dict[str, Any]
    load: dict[str, Any]
    failures: list[str]
    wall_s: float

    @property
    def passed(self) -> bool:
        return not self.failures


def chaos_settings(scratch: Path, profile: str = "") -> Settings:
    """The fault benchmarks' stack settings (free ports, no per-client cap), with short
    ack deadlines so that what a dead leader or worker held comes back within the run."""
    if profile not in ("", "cluster"):
        raise ValueError(f"unknown profile {profile!r}: expected cluster or none")
    settings = cluster_profile_settings(scratch) if profile else stack_settings(scratch)
    dispatcher = settings.dispatcher.model_copy(
        update={"ack_timeout_s": 5.0, "max_ack_timeout_s": 20.0, "worker_expiry_s": 6.0}
    )
    return settings.model_copy(update={"dispatcher": dispatcher})


@unwinds_on_sigterm
def run_chaos(options: ChaosOptions) -> ChaosResult:
    unknown = [kind for kind in options.faults if kind not in FAULT_KINDS]
    if unknown:
        raise ValueError(f"unknown faults {unknown}; known: {', '.join(FAULT_KINDS)}")
    began = time.monotonic()
    with contextlib.ExitStack() as cleanup:
        if options.scratch is None:
            scratch = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="chaos-")))
        else:
            scratch = options.scratch
            scratch.mkdir(parents=True, exist_ok=True)
        settings = chaos_settings(scratch, options.profile)
        # Ended sooner than `down` alone (`quick_down`): the data is this run's only.
        stack = cleanup.enter_context(running_stack(settings, quick_down=True))
        chaos = Chaos(options, settings, stack)
        cleanup.callback(chaos.http.close)
        fleet = WorkerFleet(
            settings, chaos.urls, chaos.keys["worker"], options.workers, options.slots,
            scratch / "runs",
        )  # fmt: skip
        cleanup.callback(fleet.stop)
        fleet.start_missing()
        _wait_workers(chaos.urls, chaos.keys["admin"], options.workers)
        phases = {"stack_up_s": round(time.monotonic() - began, 1)}
        planned = job_mix(options.jobs, options.seed)
        faults: list[FaultRecord] = []
        window_s = options.jobs / options.rate
        with Load(planned, chaos.urls, chaos.keys["client"], options.rate, settings) as load:
            started = time.monotonic()
            previous_end = started
            for number, (kind, due) in enumerate(
                zip(options.faults, fault_times(len(options.faults), window_s), strict=True)
            ):
                # On schedule, but never sooner than `gap_s` after the previous fault ended,
                # so that each fault's figures are its own.
                due_at = max(started + due, previous_end + options.gap_s)
                time.sleep(max(0.0, due_at - time.monotonic()))
                faults.append(chaos.inject(number, kind, started, fleet))
                previous_end = time.monotonic()
                print(f"fault {number + 1}/{len(options.faults)}: {faults[-1]}", flush=True)
            load.thread.join()
        print(f"load done ({len(load.accepted)} accepted); waiting for the canaries", flush=True)
        phases["load_and_faults_s"] = round(time.monotonic() - began - phases["stack_up_s"], 1)
        chaos.join_canaries(240.0)
        return _audit(options, settings, chaos, fleet, load, planned, faults, began, phases)
    raise AssertionError("unreachable")  # the ExitStack does not swallow exceptions


def _wait_workers(urls: Sequence[str], admin_key: str, count: int, timeout_s: float = 90) -> None:
    from dispatch.client import Client

    deadline = time.monotonic() + timeout_s
    with Client(urls, api_key=admin_key) as client:
        while len(client.workers()) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} workers did not connect in {timeout_s:.0f} s")
            time.sleep(0.5)


def _audit(
    options: ChaosOptions, settings: Settings, chaos: Chaos, fleet: WorkerFleet, load: Load,
    planned: Sequence[PlannedJob], faults: list[FaultRecord], began: float,
    phases: dict[str, float],
) -> ChaosResult:  # fmt: skip
    expected = expected_status(planned)
    canary_ids = [fault.canary_id for fault in faults]
    expected.update(dict.fromkeys(canary_ids, "succeeded"))
    known = set(expected) | set(canary_ids)
    print("waiting until every job ended", flush=True)
    statuses, waited = wait_terminal(
        chaos.urls, chaos.keys["admin"], known, options.settle_timeout_s
    )
    print(f"settled after {waited} s; reading the log, the runs, Delta", flush=True)
    records, log_end = events_log(settings)
    log = audit_log(records)
    run_lines = list(fleet.runs())
    runs = audit_runs(run_lines, fleet.killed)
    across_outage = ran_across_an_outage(run_lines, outage_windows(faults))
    rejected = rejected_keys(settings)
    audit_began = time.monotonic()
    fold = chaos.stack.streaming
    delta = delta_statuses(settings, log_end, options.delta_timeout_s, fold.exit_code)
    phases["delta_wait_s"] = round(time.monotonic() - audit_began, 1)
    accepted = load.accepted | {fault.canary_id for fault in faults if fault.canary_s is not None}
    planned_ids = {job.id for job in planned} | set(canary_ids)
    for fault in faults:
        fault.kill_to_first_completion_s = _since(fault, log.completion_times)
        fault.kill_to_first_accept_s = _since(fault, load.accept_times)
        completed_at = log.first_completed_at.get(fault.canary_id)
        if completed_at is not None:
            fault.canary_completed_in_log_s = round(completed_at - fault.killed_at, 3)
        if fault.answering_at is not None:
            first = first_after(load.accept_times, fault.answering_at)
            if first is not None:
                fault.broker_answering_to_first_accept_s = round(first - fault.answering_at, 3)
    examples = {
        "lost": lost_jobs(accepted, statuses),
        "unexpected": unexpected_jobs(log.enqueued, planned_ids),
        "completed_twice": sorted(job for job, count in log.completions.items() if count > 1),
        "ran_to_success_twice": runs.twice,
        "wrong_terminal_state": wrong_states(expected, statuses, across_outage),
        "delta_api_disagreements": (
            disagreements(statuses, delta, accepted) if delta is not None else []
        ),
        "events_without_enqueued": sorted(log.orphans),
        "malformed_not_rejected": sorted(load.malformed_acked - rejected),
        "ran_twice_after_worker_kill": runs.twice_after_worker_kill,
    }
    safety: dict[str, int | None] = {
        "lost": len(examples["lost"]),
        "unexpected": len(examples["unexpected"]),
        "completed_twice": len(examples["completed_twice"]),
        "ran_to_success_twice": len(examples["ran_to_success_twice"]),
        "wrong_terminal_state": len(examples["wrong_terminal_state"]),
        "deposed_epoch_writes": log.deposed_events,
        "events_without_enqueued": len(log.orphans),
        "delta_api_disagreements": (
            len(examples["delta_api_disagreements"]) if delta is not None else None
        ),
        "malformed_not_rejected": len(examples["malformed_not_rejected"]),
    }
    liveness = {
        "workers_exited_unexpectedly": fleet.exited(),
        "worker_slot_overruns": runs.overruns,
        "worker_more_than_slots_warnings": fleet.slot_warnings(),
        "worker_max_running": runs.max_running,
        "slots": options.slots,
        "attempts_started": runs.started,
        "ran_twice_after_worker_kill": len(runs.twice_after_worker_kill),
        "terms": [epoch for epoch, _ in log.elected],
        "settle_wait_s": waited,
        "phases": phases,
        "statuses": dict(Counter(str(status) for status in statuses.values())),
    }
    load_figures = {
        "planned": len(planned),
        "accepted": len(load.accepted),
        "malformed_sent": len(load.malformed_acked),
        "failed_rest_batches": load.failed_batches,
        "failed_kafka_records": load.failed_records,
        "errors": dict(load.errors),
    }
    return ChaosResult(
        options={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
        safety=safety,
        examples={name: ids[:20] for name, ids in examples.items()},
        faults=faults,
        liveness=liveness,
        load=load_figures,
        failures=verdict(safety, faults),
        wall_s=round(time.monotonic() - began, 1),
    )


def _since(fault: FaultRecord, times: Sequence[float]) -> float | None:
    first = first_after(times, fault.killed_at)
    return None if first is None else round(first - fault.killed_at, 3)


# --- output --------------------------------------------------------------------------------------


def result_json(result: ChaosResult) -> dict[str, Any]:
    document = asdict(result)
    document["passed"] = result.passed
    return document


def print_tables(result: ChaosResult) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a log file or a pipe: do not cut the examples
    safety = Table(title="safety (all must be 0)")
    safety.add_column("count")
    safety.add_column("value", justify="right")
    safety.add_column("examples")
    for name, value in result.safety.items():
        shown = "not measured" if value is None else str(value)
        safety.add_row(name, shown, ", ".join(result.examples.get(name, [])[:5]))
    console.print(safety)
    faults = Table(title="faults (seconds)")
    for column in ("#", "fault", "at", "target", "recovered", "first completion",
                   "first accept", "canary", "canary in log", "canary status"):  # fmt: skip
        faults.add_column(column)
    for number, fault in enumerate(result.faults, start=1):
        faults.add_row(
            str(number), fault.kind, f"{fault.at_s:.1f}", fault.target, _s(fault.recovered_s),
            _s(fault.kill_to_first_completion_s), _s(fault.kill_to_first_accept_s),
            _s(fault.canary_s), _s(fault.canary_completed_in_log_s), str(fault.canary_status),
        )  # fmt: skip
    console.print(faults)
    liveness = Table(title="liveness and load")
    liveness.add_column("figure")
    liveness.add_column("value")
    for name, value in {**result.liveness, **result.load}.items():
        liveness.add_row(name, json.dumps(value))
    console.print(liveness)
    verdict_text = "PASS" if result.passed else "FAIL: " + "; ".join(result.failures)
    console.print(f"{verdict_text}  (wall {result.wall_s:.0f} s)")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


@unwinds_on_sigterm
def main(argv: list[str] | None = None, prog: str = "python -m dispatch.bench.chaos") -> int:
    """The command line; `prog` is the name its usage shows (`dispatch chaos` passes its own)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, help="planned jobs (default: rate x duration, 6000)")
    parser.add_argument("--rate", type=float, default=150.0, help="jobs submitted per second")
    parser.add_argument("--duration", type=float, help="seconds of load (sets --jobs)")
    parser.add_argument("--faults", type=parse_faults, default=DEFAULT_FAULTS,
                        help=f"comma-separated, in order, of {', '.join(FAULT_KINDS)}")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=8, help="concurrency of each worker")
    parser.add_argument("--pause", type=float, default=6.0, help="SIGSTOP seconds")
    parser.add_argument("--broker-down", type=float, default=3.0, help="seconds before restart")
    parser.add_argument(
        "--gap", type=float, default=5.0, help="least seconds from one fault's end to the next"
    )
    parser.add_argument("--settle-timeout", type=float, default=300.0)
    parser.add_argument("--keep", type=Path, help="keep the stack's folder (logs) here")
    parser.add_argument(
        "--profile", choices=["cluster"], help="the cluster profile's stack (conf/profiles/)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the result as JSON on stdout, not as tables"
    )
    parser.add_argument("--out", type=Path, help="also write the result as JSON to this file")
    args = parser.parse_args(argv)
    jobs = args.jobs
    if jobs is None:
        jobs = round(args.rate * args.duration) if args.duration else 6000
    options = ChaosOptions(
        jobs=jobs, rate=args.rate, faults=args.faults, seed=args.seed, workers=args.workers,
        slots=args.slots, pause_s=args.pause, broker_down_s=args.broker_down, gap_s=args.gap,
        settle_timeout_s=args.settle_timeout, scratch=args.keep, profile=args.profile or "",
    )  # fmt: skip
    result = run_chaos(options)
    document = result_json(result)
    if args.json:
        print(json.dumps(document, indent=1))
    else:
        print_tables(result)
    if args.out:
        args.out.write_text(json.dumps(document, indent=1))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())

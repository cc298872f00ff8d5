"""`dispatch bench`: end-to-end jobs/s and latency through a real broker and a real node,
beside the raw kafka-python produce→consume rate of the same records on the same broker.

What runs: the broker of the local stack if one answers, else a temporary one; fresh topics;
`dispatch serve` as a process of its own (as in production, it does not share a GIL with the
load); W WebSocket workers and a batch submitter in this process. Latencies are the leader's
decision times in the committed event log (`assigned.at` / `completed.at`) minus the time the
submit request left this process; submit→assign is also split at the job's `dispatch.submit`
record timestamp (request→record: HTTP and the node's send; record→assign: Kafka and the
leader's loop). One machine, one clock.

Warm-up: `warmup_jobs` jobs go through first, the same way, and are left out of the figures
(their submit→assign is reported on its own). A fresh broker's transactions take twice as
long for their first couple of thousand commits (its JIT compiles the transaction path: a
lone commit loop measured 5.4 ms p50 for the first 250, 2.7 ms after 2,500), and the first
seconds of a run measured that, not the dispatcher a long-running broker serves.

The SDK loop (`sdk_loop` calls of `Client.submit`, after the measured phase): one after the
other, or over `sdk_threads` threads sharing one `Client`, or from `sdk_async` tasks on one
`AsyncClient` (`sdk_loop_mode`: "sequential", "threads:T", "async:C").

CPU per job by process (`cpu`; `sdk_loop_cpu` for the SDK loop): over the measured phase, the
CPU of the broker's JVM, the node (the leader: `/readyz` answers 200 on a leader only), the
bench's process (its W workers: coroutines of one event loop, so one row), the load
generator (its CPU while submitting, which it reports itself, and its start-up and exit: the
rest of what this process's ended children used) and the rest of the machine, in µs per job
(`dispatch.bench.process_cpu`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from kafka import KafkaConsumer, KafkaProducer

from dispatch.api.kafka_log import replay_events
from dispatch.auth import ensure_dev_keys
from dispatch.bench.acking_worker import run_acking_worker
from dispatch.bench.process_cpu import (
    CpuReport,
    CpuWindow,
    Watched,
    children_cpu_s,
    format_table,
)
from dispatch.bench.signals import unwinds_on_sigterm
from dispatch.bench.stats import machine, percentiles
from dispatch.core.events import Assigned, Completed
from dispatch.settings import Settings, to_environment
from dispatch.stack.broker import Broker, KafkaCluster, create_topics
from dispatch.stack.ports import free_port

DISPATCH = str(Path(sys.executable).parent / "dispatch")


@dataclass
class BenchResult:
    jobs: int
    workers: int
    batch: int
    clients: int
    payload_bytes: int
    rate_limit: float | None
    seconds: float
    jobs_per_s: float
    """End to end: measured jobs / seconds from the first submission to the last completion."""
    submit_requests_per_s: float
    """Submit requests answered 202 per second while submitting (N clients)."""
    submit_jobs_per_s: float
    request_ms: dict[str, float]
    """Each submit request's round trip, as its client saw it."""
    behind_ms: dict[str, float] | None
    """Open loop: how late requests left after their due time (the schedule slipped when
    every client was waiting for an answer)."""
    submit_to_assign_ms: dict[str, float]
    submit_to_complete_ms: dict[str, float]
    raw_kafka_records_per_s: float
    submit_to_record_ms: dict[str, float]
    """Split of submit→assign, part 1: the request left the submitter → the node's producer
    stamped the job's `dispatch.submit` record (HTTP, validation, the handler's `send`)."""
    record_to_assign_ms: dict[str, float]
    """Part 2: the record's stamp → the leader assigned the job (the producer's linger and
    the broker's ack, the leader's fetch, the wait for the loop's iteration in progress)."""
    machine_before: dict[str, Any]
    machine_after: dict[str, Any]
    warmup_jobs: int = 0
    warmup_submit_to_assign_ms: dict[str, float] | None = None
    """submit→assign of the warm-up jobs (left out of every other figure)."""
    sdk_loop_jobs: int = 0
    sdk_loop_mode: str | None = None
    """How the SDK loop called (`sdk_loop_mode()`); None without an SDK loop."""
    sdk_loop_jobs_per_s: float | None = None
    """A `Client.submit` loop (the SDK, one job per request; one at a time when sequential)."""
    sdk_loop_ms: dict[str, float] | None = None
    cpu: CpuReport | None = None
    """CPU per job by process over the measured phase (`dispatch.bench.process_cpu`)."""
    sdk_loop_cpu: CpuReport | None = None
    """The same over the SDK loop."""
    transactions: int | None = None
    """The leader's Kafka transactions over the measured phase (its /metrics): what the broker
    pays most for a job, so jobs per transaction says how well decisions were batched."""
    sdk_loop_transactions: int | None = None
    """The same over the SDK loop."""

    @property
    def ratio(self) -> float:
        return self.jobs_per_s / self.raw_kafka_records_per_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio_to_raw_kafka": round(self.ratio, 3)}


@contextlib.contextmanager
def broker_for(settings: Settings) -> Iterator[Settings]:
    """The running local broker, or a temporary one on free ports, stopped afterwards."""
    if Broker(settings).running() is not None:
        yield settings
        return
    with tempfile.TemporaryDirectory(prefix="dispatch-bench-broker-") as scratch:
        temporary = settings.model_copy(
            update={
                "paths": settings.paths.model_copy(update={"var": Path(scratch)}),
                "kafka": settings.kafka.model_copy(
                    update={"bootstrap": f"127.0.0.1:{free_port()}", "controller_port": free_port()}
                ),
            }
        )
        broker = Broker(temporary)
        broker.start()
        try:
            yield temporary
        finally:
            broker.stop()


def broker_processes(settings: Settings) -> list[Watched]:
    """The broker JVMs of the local stack or the bench's own (none when `kafka.external`)."""
    try:
        brokers = KafkaCluster(settings).running()
        if not brokers and Broker(settings).running() is not None:  # `external`, yet ours
            brokers = [Broker(settings)]
    except ValueError:  # addresses and controller ports that do not pair: none of ours
        brokers = []
    records = [(broker, broker.running()) for broker in brokers]
    return [
        Watched("broker" if len(records) == 1 else f"broker {broker.node.node_id}", record.pid)
        for broker, record in records
        if record is not None
    ]


def sdk_loop_mode(threads: int = 1, tasks: int = 0) -> str:
    """The SDK loop's mode as the bench's JSON names it: "sequential", "threads:T" (T threads
    sharing one `Client`) or "async:C" (C tasks on one `AsyncClient`). Both at once would be
    neither figure, so that is refused."""
    if threads < 1 or tasks < 0:
        raise ValueError(f"SDK loop: {threads} threads and {tasks} tasks")
    if tasks and threads > 1:
        raise ValueError("SDK loop: threads or async tasks, not both")
    if tasks:
        return f"async:{tasks}"
    return "sequential" if threads == 1 else f"threads:{threads}"


def sdk_loop_name(mode: str | None) -> str:
    """The name of the SDK loop's figures and CPU table: `SDK loop` when sequential (its name
    before the other modes), else with its mode in words."""
    kind, _, count = (mode or "sequential").partition(":")
    if kind == "threads":
        return f"SDK loop, {count} threads sharing one Client"
    if kind == "async":
        return f"SDK loop, {count} tasks on one AsyncClient"
    return "SDK loop"


def cpu_tables(result: BenchResult) -> str:
    """The text of the CPU-per-job tables (`dispatch bench` prints them under its figures)."""
    tables = []
    if result.cpu is not None:
        tables.append(format_table(result.cpu, "CPU per job by process, measured phase"))
    if result.sdk_loop_cpu is not None:
        title = f"CPU per job by process, {sdk_loop_name(result.sdk_loop_mode)}"
        tables.append(format_table(result.sdk_loop_cpu, title))
    return "\n\n".join(tables)


def bench_settings(settings: Settings, scratch: Path) -> Settings:
    """Fresh topics and keys of this run, on the given broker."""
    namespace = f"bench-{int(time.time() * 1000)}"
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(
                update={
                    "submit_topic": f"{namespace}.dispatch.submit",
                    "events_topic": f"{namespace}.dispatch.events",
                    "rejected_topic": f"{namespace}.dispatch.submit.rejected",
                }
            ),
            "auth": settings.auth.model_copy(
                update={"keys_file": scratch / "keys.json", "dev_keys_file": scratch / "dev.json"}
            ),
            # No-op jobs are acked at once; a generous timeout keeps retries out of the figure.
            # A group of its own: on the local stack's broker, the stack's nodes hold the
            # lease of the default group and the bench's node would only follow.
            "dispatcher": settings.dispatcher.model_copy(
                update={
                    "group": namespace,
                    "ack_timeout_s": 60.0,
                    "max_ack_timeout_s": 120.0,
                    "default_cap": 1_000_000,
                }
            ),
        }
    )


def raw_kafka_rate(settings: Settings, count: int, payload_bytes: int) -> float:
    """Records/s of kafka-python alone: produce (acks=all, idempotent) and consume
    (read_committed) `count` records of the bench's size, concurrently, on the same broker."""
    topic = f"{settings.kafka.submit_topic}.raw"
    create_topics(settings.kafka, {topic: settings.kafka.submit_partitions})
    value = json.dumps(
        {"id": "x" * 32, "exec": "bench.noop", "payload": "p" * payload_bytes}
    ).encode()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka.bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        enable_auto_commit=False,
        group_id=None,
        max_poll_records=5000,
    )
    consumer.poll(timeout_ms=1000)  # join before producing, so the clock measures the flow
    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all", linger_ms=2)

    def produce() -> None:
        for n in range(count):
            producer.send(topic, key=str(n).encode(), value=value)
        producer.flush()

    started = time.monotonic()
    sender = threading.Thread(target=produce)
    sender.start()
    received = 0
    while received < count:
        received += sum(len(batch) for batch in consumer.poll(timeout_ms=1000).values())
        if time.monotonic() - started > 300:
            raise TimeoutError(f"raw Kafka: {received} of {count} records in 300 s")
    elapsed = time.monotonic() - started
    sender.join()
    producer.close()
    consumer.close()
    return count / elapsed


def leader_transactions(url: str) -> int | None:
    """How many transactions the leader at `url` committed so far (the count of its commit
    histogram), or None when its /metrics does not say."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("dispatch_commit_seconds_count"):
            return int(float(line.rsplit(" ", 1)[1]))
    return None


def _since(now: int | None, before: int | None) -> int | None:
    return now - before if now is not None and before is not None else None


def jobs_per_transaction(jobs: int, transactions: int | None) -> str:
    return f"{jobs / transactions:.2f}" if transactions else "-"


class Load:
    """Submits `jobs` no-op jobs from `clients` concurrent submitters (a process of their own,
    `dispatch.bench.submitters`) and runs `workers` WebSocket workers in this process that ack
    them."""

    def __init__(self, url: str, keys: dict[str, str], *, jobs: int, workers: int, batch: int,
                 clients: int, payload_bytes: int, rate: float | None, warmup_jobs: int = 0,
                 sdk_loop: int = 0, sdk_threads: int = 1, sdk_async: int = 0,
                 watched: list[Watched] | None = None) -> None:  # fmt: skip
        self.url, self.keys = url, keys
        self.watched = watched or []
        """Processes whose CPU per job is read over the measured phase and the SDK loop."""
        self.cpu: CpuReport | None = None
        self.sdk_cpu: CpuReport | None = None
        self.jobs, self.workers, self.batch, self.clients = jobs, workers, batch, clients
        self.warmup_jobs, self.sdk_loop = warmup_jobs, sdk_loop
        self.sdk_threads, self.sdk_async = sdk_threads, sdk_async
        self.payload_bytes = payload_bytes
        self.rate = rate
        self.completed = 0
        self._expected = 0
        self.done = asyncio.Event()
        self.submitted: dict[str, Any] = {}
        """The measured phase's submitters' report (`dispatch.bench.submitters`)."""
        self.warmup_submitted: dict[str, Any] = {}
        self.sdk_submitted: dict[str, Any] = {}
        self.transactions: int | None = None
        self.sdk_transactions: int | None = None

    async def run(self) -> float:
        """Run the warm-up jobs to completion, then the measured ones, then the SDK loop;
        returns the seconds from the first measured submission to the last measured
        completion."""
        ready = [asyncio.Event() for _ in range(self.workers)]
        tasks = [
            asyncio.create_task(self._worker(f"bench-w{n}", ready[n])) for n in range(self.workers)
        ]
        await asyncio.gather(*(event.wait() for event in ready))
        if self.warmup_jobs:
            self.warmup_submitted = await self._phase("warm", self.warmup_jobs)
        # The bench's own collector pauses (up to 45 ms seen in its event loop) would delay
        # acks and count as the dispatcher's latency: off while measuring.
        gc.collect()
        gc.disable()
        try:
            window, ended = CpuWindow(self.watched), children_cpu_s()
            committed = await asyncio.to_thread(leader_transactions, self.url)
            window.start()
            started = time.monotonic()
            self.submitted = await self._phase("job", self.jobs)
            elapsed = time.monotonic() - started
            window.stop()
            self.transactions = _since(
                await asyncio.to_thread(leader_transactions, self.url), committed
            )
        finally:
            gc.enable()
        what = f"{self.clients} clients, batch {self.batch}"
        self.cpu = self._cpu(window, children_cpu_s() - ended, self.submitted, self.jobs, what)
        if self.sdk_loop:
            window, ended = CpuWindow(self.watched), children_cpu_s()
            committed = await asyncio.to_thread(leader_transactions, self.url)
            window.start()
            self.sdk_submitted = await self._phase("sdk", self.sdk_loop, sdk=True)
            window.stop()
            self.sdk_transactions = _since(
                await asyncio.to_thread(leader_transactions, self.url), committed
            )
            ended = children_cpu_s() - ended
            what = sdk_loop_name(sdk_loop_mode(self.sdk_threads, self.sdk_async))
            self.sdk_cpu = self._cpu(window, ended, self.sdk_submitted, self.sdk_loop, what)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return elapsed

    @staticmethod
    def _cpu(window: CpuWindow, ended_s: float, report: dict[str, Any], jobs: int,
             what: str) -> CpuReport:  # fmt: skip
        """The window's report with the load generator's rows: the process ended inside the
        window, so its CPU is what it measured while submitting, and the rest of what this
        process's children that ended in the window used (the interpreter's start-up, the
        imports, the report)."""
        pid, submitting = report.get("pid"), float(report.get("cpu_s", 0.0))
        window.add(f"load generator ({what})", pid, submitting)
        window.add("load generator: start-up, imports, exit", pid, max(0.0, ended_s - submitting))
        return window.report(jobs)

    async def _phase(self, prefix: str, count: int, *, sdk: bool = False) -> dict[str, Any]:
        self.done.clear()
        self._expected += count
        report = await self._submit(prefix, count, sdk=sdk)
        await asyncio.wait_for(self.done.wait(), timeout=600)
        return report

    async def _submit(self, prefix: str, count: int, *, sdk: bool) -> dict[str, Any]:
        host, _, port = self.url.removeprefix("http://").partition(":")
        plan = {"host": host, "port": int(port), "key": self.keys["client"], "prefix": prefix,
                "jobs": count, "clients": self.clients, "batch": self.batch,
                "payload_bytes": self.payload_bytes, "rate": self.rate, "sdk": sdk,
                "sdk_threads": self.sdk_threads, "sdk_async": self.sdk_async}  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dispatch.bench.submitters",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await process.communicate(json.dumps(plan).encode())
        if process.returncode != 0:
            raise RuntimeError(f"the submitters failed:\n{err.decode()[-3000:]}")
        report: dict[str, Any] = json.loads(out)
        return report

    async def _worker(self, worker_id: str, ready: asyncio.Event) -> None:
        def settled(count: int) -> None:
            self.completed += count
            if self.completed >= self._expected:
                self.done.set()

        await run_acking_worker(
            self.url, self.keys["worker"], worker_id, 512, connected=ready.set, settled=settled
        )


def record_times(settings: Settings) -> dict[str, float]:
    """Each job's `dispatch.submit` record timestamp (the node's producer stamps it when its
    handler sends), by job id (the record key)."""
    consumer = KafkaConsumer(
        settings.kafka.submit_topic,
        bootstrap_servers=settings.kafka.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
        client_id="bench-audit-submit",
    )
    try:
        return {
            record.key.decode(): record.timestamp / 1000.0
            for record in consumer
            if record.key is not None
        }
    finally:
        consumer.close()


def decision_times(settings: Settings) -> tuple[dict[str, float], dict[str, float]]:
    """When the leader first assigned and when it completed each job (its clock, from the
    committed log), by job id: one replay of the log serves every latency."""
    assigned: dict[str, float] = {}
    completed: dict[str, float] = {}
    for batch in replay_events(settings.kafka, client_id="bench-audit"):
        for event in batch.events:
            if isinstance(event, Assigned) and event.attempt == 1:
                assigned.setdefault(event.job_id, event.at)
            elif isinstance(event, Completed):
                completed.setdefault(event.job_id, event.at)
    return assigned, completed


def since(start: dict[str, float], end: dict[str, float]) -> list[float]:
    """`end - start` for every job in both."""
    return [at - start[job_id] for job_id, at in end.items() if job_id in start]


@unwinds_on_sigterm
def run_bench(settings: Settings, *, jobs: int, workers: int, batch: int, payload_bytes: int,
              rate: float | None, clients: int = 4, warmup_jobs: int = 0, sdk_loop: int = 0,
              sdk_threads: int = 1, sdk_async: int = 0) -> BenchResult:  # fmt: skip
    mode = sdk_loop_mode(sdk_threads, sdk_async)  # refused before a broker starts
    before = machine()
    with (
        broker_for(settings) as on_broker,
        tempfile.TemporaryDirectory(prefix="dispatch-bench-") as scratch,
    ):
        run = bench_settings(on_broker, Path(scratch))
        create_topics(run.kafka)
        raw = raw_kafka_rate(run, jobs, payload_bytes)
        keys = ensure_dev_keys(run.auth)
        port = free_port()
        log_file = Path(scratch) / "node.log"
        with log_file.open("wb") as log:
            node = subprocess.Popen(
                [DISPATCH, "serve", "--port", str(port), "--node-id", "bench"],
                env={**os.environ, **to_environment(run)}, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, node, log_file)
            # The node answered /readyz 200: it is the leader (a follower answers 503).
            watched = [
                *broker_processes(on_broker),
                Watched("leader node (dispatch serve)", node.pid),
                Watched(f"bench process: {workers} workers", os.getpid(), "own"),
            ]
            load = Load(url, keys, jobs=jobs, workers=workers, batch=batch, clients=clients,
                        payload_bytes=payload_bytes, rate=rate, warmup_jobs=warmup_jobs,
                        sdk_loop=sdk_loop, sdk_threads=sdk_threads, sdk_async=sdk_async,
                        watched=watched)  # fmt: skip
            try:
                elapsed = asyncio.run(load.run())
            except Exception as error:
                raise RuntimeError(
                    f"{error!r}; the node's log ends:\n{log_file.read_text()[-6000:]}"
                ) from error
            terms = httpx.get(f"{url}/readyz", timeout=5).json()["terms"]
            if terms != 1:
                log_tail = log_file.read_text()[-5000:]
                raise RuntimeError(f"the leader restarted during the run:\n{log_tail}")
        finally:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(30)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
        after = machine()
        assigned, completed = decision_times(run)
        submitted = load.submitted
        sent: dict[str, float] = submitted["sent_at"]
        recorded = {job_id: at for job_id, at in record_times(run).items() if job_id in sent}
        warm_sent = load.warmup_submitted.get("sent_at", {})
        sdk = load.sdk_submitted
        return BenchResult(
            jobs=jobs, workers=workers, batch=batch, clients=clients,
            payload_bytes=payload_bytes, rate_limit=rate,
            seconds=round(elapsed, 3), jobs_per_s=round(jobs / elapsed, 1),
            submit_requests_per_s=submitted["requests_per_s"],
            submit_jobs_per_s=submitted["jobs_per_s"],
            request_ms=submitted["request_ms"], behind_ms=submitted["behind_ms"],
            submit_to_assign_ms=percentiles(since(sent, assigned)),
            submit_to_complete_ms=percentiles(since(sent, completed)),
            raw_kafka_records_per_s=round(raw, 1),
            submit_to_record_ms=percentiles(since(sent, recorded)),
            record_to_assign_ms=percentiles(since(recorded, assigned)),
            machine_before=before, machine_after=after,
            warmup_jobs=warmup_jobs,
            warmup_submit_to_assign_ms=(
                percentiles(since(warm_sent, assigned)) if warmup_jobs else None
            ),
            sdk_loop_jobs=sdk_loop, sdk_loop_mode=mode if sdk_loop else None,
            sdk_loop_jobs_per_s=sdk["jobs_per_s"] if sdk else None,
            sdk_loop_ms=sdk["request_ms"] if sdk else None,
            cpu=load.cpu, sdk_loop_cpu=load.sdk_cpu,
            transactions=load.transactions, sdk_loop_transactions=load.sdk_transactions,
        )  # fmt: skip


def _wait_ready(url: str, node: subprocess.Popen[bytes], log_file: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if node.poll() is not None:
            raise RuntimeError(f"the node exited:\n{log_file.read_text()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the node was not ready in 90 s:\n{log_file.read_text()[-3000:]}")

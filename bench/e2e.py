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
import websockets
from kafka import KafkaConsumer, KafkaProducer

from api.auth import ensure_dev_keys
from api.kafka_log import replay_events
from dispatch.core.events import Assigned, Completed
from dispatch.settings import Settings, to_environment
from dispatch.stack.broker import Broker, create_topics
from dispatch.stack.ports import free_port

DISPATCH = str(Path(sys.executable).parent / "dispatch")


@dataclass
class BenchResult:
    jobs: int
    workers: int
    payload_bytes: int
    rate_limit: float | None
    seconds: float
    jobs_per_s: float
    submit_to_assign_ms: dict[str, float]
    submit_to_complete_ms: dict[str, float]
    raw_kafka_records_per_s: float
    submit_to_record_ms: dict[str, float]
    """Split of submit→assign, part 1: the request left this process → the node's producer
    stamped the job's `dispatch.submit` record (HTTP, validation, the handler's `send`)."""
    record_to_assign_ms: dict[str, float]
    """Part 2: the record's stamp → the leader assigned the job (the producer's linger and
    the broker's ack, the leader's fetch, the wait for the loop's iteration in progress)."""
    warmup_jobs: int = 0
    warmup_submit_to_assign_ms: dict[str, float] | None = None
    """submit→assign of the warm-up jobs (left out of every other figure)."""

    @property
    def ratio(self) -> float:
        return self.jobs_per_s / self.raw_kafka_records_per_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio_to_raw_kafka": round(self.ratio, 3)}


def percentiles(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {}
    ordered = sorted(seconds)

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000, 2)

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": round(ordered[-1] * 1000, 2)}


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
            "dispatcher": settings.dispatcher.model_copy(
                update={"ack_timeout_s": 60.0, "max_ack_timeout_s": 120.0, "default_cap": 1_000_000}
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


class Load:
    """Submits `jobs` no-op jobs in batches and runs `workers` WebSocket workers that ack."""

    def __init__(self, url: str, keys: dict[str, str], jobs: int, workers: int, batch: int,
                 payload_bytes: int, rate: float | None, warmup_jobs: int = 0) -> None:  # fmt: skip
        self.url, self.keys = url, keys
        self.jobs, self.workers, self.batch = jobs, workers, batch
        self.warmup_jobs = warmup_jobs
        self.payload = "p" * payload_bytes
        self.rate = rate
        self.completed = 0
        self._expected = 0
        self.done = asyncio.Event()
        self.submitted_at: dict[str, float] = {}
        """Wall time at which each measured job's submit request was sent (same clock as the
        leader's)."""
        self.warmup_submitted_at: dict[str, float] = {}

    async def run(self) -> float:
        """Run the warm-up jobs to completion, then the measured ones; returns the seconds
        from the first measured submission to the last measured completion."""
        ready = [asyncio.Event() for _ in range(self.workers)]
        tasks = [
            asyncio.create_task(self._worker(f"bench-w{n}", ready[n])) for n in range(self.workers)
        ]
        await asyncio.gather(*(event.wait() for event in ready))
        if self.warmup_jobs:
            await self._phase("warm", self.warmup_jobs, self.warmup_submitted_at)
        # The bench's own collector pauses (up to 45 ms seen in its event loop) would delay
        # submissions and acks and count as the dispatcher's latency: off while measuring.
        gc.collect()
        gc.disable()
        try:
            started = time.monotonic()
            await self._phase("job", self.jobs, self.submitted_at)
            elapsed = time.monotonic() - started
        finally:
            gc.enable()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return elapsed

    async def _phase(self, prefix: str, count: int, sent_at: dict[str, float]) -> None:
        self.done.clear()
        self._expected += count
        await self._submit(prefix, count, sent_at)
        await asyncio.wait_for(self.done.wait(), timeout=600)

    async def _submit(self, prefix: str, count: int, sent_at: dict[str, float]) -> None:
        headers = {"Authorization": f"Bearer {self.keys['client']}"}
        limits = asyncio.Semaphore(4)  # a few batches in flight hide one round trip each
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=60) as client:

            async def post(first: int) -> None:
                async with limits:
                    jobs = [
                        {"id": f"{prefix}-{n}", "exec": "bench.noop", "payload": self.payload}
                        for n in range(first, min(first + self.batch, count))
                    ]
                    sent = time.time()
                    for job in jobs:
                        sent_at[job["id"]] = sent
                    answer = await client.post("/v1/jobs:batch", json={"jobs": jobs})
                    answer.raise_for_status()

            posts = []
            for first in range(0, count, self.batch):
                if self.rate:
                    # Open loop at the target rate: batch k leaves at k * batch / rate.
                    delay = started + first / self.rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                posts.append(asyncio.create_task(post(first)))
            await asyncio.gather(*posts)

    async def _worker(self, worker_id: str, ready: asyncio.Event) -> None:
        url = self.url.replace("http://", "ws://") + "/v1/stream"
        headers = {"Authorization": f"Bearer {self.keys['worker']}"}
        credit = 512
        async with websockets.connect(
            url, additional_headers=headers, proxy=None, max_queue=None, compression=None
        ) as socket:
            hello = {"type": "hello", "role": "worker", "worker_id": worker_id,
                     "subjects": ["job.assign.bench.>"]}  # fmt: skip
            await socket.send(json.dumps(hello))
            await socket.send(json.dumps({"type": "credit", "credits": credit}))
            ready.set()
            pending: list[dict[str, Any]] = []

            async def flush_acks() -> None:
                # No-op jobs finish at once: acking what arrived in the last 2 ms in one
                # `acks` message is what a busy worker SDK does too.
                while True:
                    await asyncio.sleep(0.002)
                    if pending:
                        batch = pending[:]
                        pending.clear()
                        await socket.send(json.dumps({"type": "acks", "acks": batch}))

            flusher = asyncio.create_task(flush_acks())
            try:
                async for raw in socket:
                    message = json.loads(raw)
                    if message["type"] == "assign":
                        pending.append({"id": message["id"], "attempt": message["attempt"],
                                        "lease": message["lease"], "result": None})  # fmt: skip
                    elif message["type"] == "settled_many":
                        settled = len(message["results"])
                        self.completed += settled
                        # Acks return no credit (SPEC 5): the worker grants more when ready.
                        await socket.send(json.dumps({"type": "credit", "credits": settled}))
                        if self.completed >= self._expected:
                            self.done.set()
            finally:
                flusher.cancel()


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


def run_bench(settings: Settings, *, jobs: int, workers: int, batch: int, payload_bytes: int,
              rate: float | None, warmup_jobs: int = 0) -> BenchResult:  # fmt: skip
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
            load = Load(url, keys, jobs, workers, batch, payload_bytes, rate, warmup_jobs)
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
        assigned, completed = decision_times(run)
        sent = load.submitted_at
        recorded = {job_id: at for job_id, at in record_times(run).items() if job_id in sent}
        return BenchResult(
            jobs=jobs, workers=workers, payload_bytes=payload_bytes, rate_limit=rate,
            seconds=round(elapsed, 3), jobs_per_s=round(jobs / elapsed, 1),
            submit_to_assign_ms=percentiles(since(sent, assigned)),
            submit_to_complete_ms=percentiles(since(sent, completed)),
            raw_kafka_records_per_s=round(raw, 1),
            submit_to_record_ms=percentiles(since(sent, recorded)),
            record_to_assign_ms=percentiles(since(recorded, assigned)),
            warmup_jobs=warmup_jobs,
            warmup_submit_to_assign_ms=(
                percentiles(since(load.warmup_submitted_at, assigned)) if warmup_jobs else None
            ),
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

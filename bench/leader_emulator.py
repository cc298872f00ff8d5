"""The leader emulator of `bench/streaming_bench.py`: the pure dispatcher core at a steady
rate, writing `dispatch.events` and `dispatch.submit` as the leader does, in a process of its
own (so it does not share the bench's GIL with the streaming application).

Every 10 ms it submits the jobs due by then (job i is due i / rate after its start, so a late
tick catches up), assigns them to workers and acks those assigned `run_s` ago, and writes what
that tick decided to `dispatch.events` (one record, or several of at most 4 MiB each when the
tick is large, in order, without a transaction), plus one `dispatch.submit` record per job.
Its core's cap on jobs in flight per client is twice what the rate keeps in flight even with
ticks 30 s late, and every worker gets credit for the whole rate for as long, so neither
limits the rate: what it submits, it assigns and completes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import MAX_CREDITS, Dispatcher
from dispatch.core.events import Assigned, Event
from dispatch.event_records import MAX_RECORD_BYTES, encode_batches
from dispatch.stack.broker import TOPIC_MAX_MESSAGE_BYTES
from dispatch.submit_records import submit_record_value

GROUP = "default"

TICK_S = 0.01

EXECS = ("image.resize", "image.crop", "text.index", "mail.send")

CLIENTS = 5

WORKERS = 8

CREDIT_EVERY_S = 1.0

LAG_SLACK_S = 30.0
"""How far behind schedule the emulator may fall before its cap or credit could bind."""

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
        self,
        workers: int = WORKERS,
        prefix: str = "job",
        *,
        cap: int | None = None,
        id_seed: int | None = None,
    ) -> None:
        config = CoreConfig(ack_timeout_s=600.0, max_ack_timeout_s=600.0, worker_expiry_s=None)
        if cap is not None:
            config = dataclasses.replace(config, default_cap=cap)
        self.core = Dispatcher(config)
        self.prefix = prefix
        self._random_ids = None if id_seed is None else random.Random(id_seed)
        """With a seed, job ids are random uuid4 hex, as clients choose them (no order a
        file's min/max statistics could prune by); else `<prefix>-<n>`."""
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
            job_id = (
                f"{self.prefix}-{index}"
                if self._random_ids is None
                else uuid.UUID(int=self._random_ids.getrandbits(128), version=4).hex
            )
            out.append(
                SubmitRequest(
                    id=job_id,
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

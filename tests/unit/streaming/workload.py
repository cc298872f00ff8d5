"""Deterministic workloads made by the pure dispatcher core, as the leader would log them.

Each command's events become one `dispatch.events` record (what one leader transaction
decides), so the log has the leader's own shape. The expected state of every job is the
core's own `Dispatcher.job(id).to_dict()`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.errors import Rejected
from dispatch.core.events import Assigned, Event, Reassigned
from dispatch.event_records import encode_batch
from dispatch.submit_records import Rejection, submit_record_value

GROUP = "default"
CONFIG = CoreConfig(
    ack_timeout_s=10.0,
    max_ack_timeout_s=40.0,
    max_attempts=3,
    worker_expiry_s=None,
    default_cap=50,
)


@dataclass
class LogRecord:
    """One `dispatch.events` record: the epoch of the leader that wrote it, its events."""

    epoch: int
    events: list[Event]

    def value(self, group: str = GROUP) -> bytes:
        return encode_batch(group, self.epoch, self.events)


@dataclass
class Workload:
    leader: Dispatcher
    """The leader whose state the tables must equal (the newest epoch's)."""
    log: list[LogRecord] = field(default_factory=list)
    submits: list[tuple[bytes, bytes]] = field(default_factory=list)
    """Records of the submit topic (key, value), as producers wrote them."""
    rejections: list[bytes] = field(default_factory=list)
    """Records of the rejected topic."""
    aborted: list[LogRecord] = field(default_factory=list)
    """Records written in a transaction that was aborted (read_committed never sees them)."""

    def expected_jobs(self) -> dict[str, dict[str, Any]]:
        return {job.id: job.to_dict() for job in self.leader.jobs()}

    def events(self) -> list[Event]:
        return [event for record in self.log for event in record.events]


class Driver:
    """Runs commands on one core and logs what each decided."""

    def __init__(self, core: Dispatcher, workload: Workload, clock: list[float]) -> None:
        self.core = core
        self.workload = workload
        self.clock = clock
        self.running: dict[str, tuple[int, str, str]] = {}
        """job id -> (attempt, lease, worker) of its current assignment, from the events."""

    def now(self, step: float = 0.5) -> float:
        self.clock[0] += step
        return self.clock[0]

    def do(self, command: Callable[[Dispatcher, float], list[Event]], step: float = 0.5) -> None:
        events = command(self.core, self.now(step))
        self.log(events)

    def log(self, events: Sequence[Event]) -> None:
        if events:
            self.workload.log.append(LogRecord(self.core.epoch, list(events)))
        self.track(events)

    def track(self, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, Assigned | Reassigned):
                self.running[event.job_id] = (event.attempt, event.lease, event.worker_id)

    def submit(self, job_id: str, exec_name: str, client_id: str, **extra: Any) -> None:
        request = SubmitRequest(
            id=job_id, exec=exec_name, payload={"n": job_id}, client_id=client_id, **extra
        )
        self.workload.submits.append((job_id.encode(), submit_record_value(request)))
        self.do(lambda core, now: core.submit(request, now))

    def ack(self, job_id: str, result: Any = None) -> None:
        attempt, lease, _ = self.running[job_id]
        self.do(lambda core, now: core.ack(job_id, attempt, lease, now, result=result))

    def fail(self, job_id: str, *, retryable: bool = True) -> None:
        attempt, lease, _ = self.running[job_id]
        self.do(
            lambda core, now: core.fail(
                job_id, attempt, lease, now, error=f"boom {attempt}", retryable=retryable
            )
        )

    def join(self, worker_id: str, pattern: str) -> None:
        self.do(lambda core, now: core.join(worker_id, [pattern], now))

    def credit(self, worker_id: str, credits: int) -> None:
        self.do(lambda core, now: core.grant_credit(worker_id, credits, now))

    def cancel(self, job_id: str) -> None:
        self.do(lambda core, now: core.cancel(job_id, now))

    def redrive(self, job_id: str) -> None:
        self.do(lambda core, now: core.redrive(job_id, now))

    def prune(self, before: float) -> None:
        self.do(lambda core, now: core.prune(before, now))

    def lose(self, worker_id: str) -> None:
        self.do(lambda core, now: core.lose_worker(worker_id, now))

    def begin(self, epoch: int) -> None:
        self.do(lambda core, now: core.begin_epoch(epoch, now))
        self.do(lambda core, now: core.resume(now))

    def tick(self, step: float) -> None:
        self.do(lambda core, now: core.tick(now), step=step)

    def heartbeat(self, job_id: str, progress: dict[str, Any] | None = None) -> None:
        attempt, lease, _ = self.running[job_id]
        self.do(lambda core, now: core.heartbeat(job_id, attempt, lease, now, progress=progress))

    def pause(self, scope: str, target: str, reason: str = "") -> None:
        self.do(lambda core, now: core.pause(scope, target, now, by="ops-key", reason=reason))

    def unpause(self, scope: str, target: str) -> None:
        self.do(lambda core, now: core.unpause(scope, target, now, by="ops-key"))

    def set_limit(self, scope: str, target: str, reason: str = "", **knobs: Any) -> None:
        self.do(
            lambda core, now: core.set_limit(
                scope, target, now, **knobs, by="ops-key", reason=reason
            )
        )

    def remove_limit(self, scope: str, target: str) -> None:
        self.do(lambda core, now: core.remove_limit(scope, target, now, by="ops-key"))


def mixed_workload(*, prune: bool = False) -> Workload:
    """Successes, retries, timeouts, a dead-letter and its redrive, cancels, a worker loss,
    rejected submissions, a leader failover with a zombie's stale-epoch writes after it, an
    aborted transaction and (with `prune`) a prune and a pruned id submitted again."""
    clock = [1_790_000_000.0]
    old = Dispatcher(CONFIG)
    workload = Workload(leader=old)
    a = Driver(old, workload, clock)
    a.do(lambda core, now: core.begin_epoch(1, now, holder="node-a"))
    a.do(lambda core, now: core.join("w-img-1", ["job.assign.image.*"], now))
    a.do(lambda core, now: core.join("w-img-2", ["job.assign.image.*"], now))
    a.do(lambda core, now: core.join("w-txt", ["job.assign.text.>"], now))
    for index in range(12):
        exec_name = ("image.resize", "image.crop", "text.index.full")[index % 3]
        client = ("alice", "bob")[index % 2]
        extra: dict[str, Any] = {}
        if index == 5:
            extra["max_attempts"] = 2
        if index == 7:
            extra["priority"] = 5
        if index == 11:
            extra["delay_s"] = 3.0
        a.submit(f"job-{index:02d}", exec_name, client, **extra)
    # Credit: assignments happen now.
    a.do(lambda core, now: core.grant_credit("w-img-1", 3, now))
    a.do(lambda core, now: core.grant_credit("w-img-2", 2, now))
    a.do(lambda core, now: core.grant_credit("w-txt", 2, now))
    running = sorted(a.running)
    a.ack(running[0], {"ok": 1, "size": [640, 480]})
    a.ack(running[1], "done")
    a.heartbeat(running[2])
    a.fail(running[2])  # retryable: requeued for attempt 2
    a.fail(running[3], retryable=False)  # permanent: dead
    # A queued job is cancelled.
    queued = [job.id for job in old.jobs() if job.status.value == "queued"]
    a.do(lambda core, now: core.cancel(queued[-1], now))
    # Deadlines pass: reassignments, and dead-letters on the last attempt.
    a.do(lambda core, now: core.tick(now), step=15.0)
    a.do(lambda core, now: core.grant_credit("w-img-1", 4, now))
    a.do(lambda core, now: core.tick(now), step=45.0)
    a.do(lambda core, now: core.tick(now), step=45.0)
    # Worker loss requeues what it holds.
    a.do(lambda core, now: core.grant_credit("w-txt", 2, now))
    a.do(lambda core, now: core.lose_worker("w-txt", now))
    dead = [job.id for job in old.jobs() if job.status.value == "dead"]
    a.do(lambda core, now: core.redrive(dead[0], now))

    # Rejected submissions (the leader writes these; here, their records directly).
    for position, (key, value) in enumerate(
        [(b"bad-1", b"{not json"), (b"bad-2", json.dumps({"id": "bad-2"}).encode())]
    ):
        workload.submits.append((key, value))
        rejection = Rejection(
            "value: not JSON" if position == 0 else "submit.exec: missing required field",
            "dispatch.submit",
            0,
            100 + position,
            key,
            value,
            a.now(),
        )
        workload.rejections.append(rejection.to_record_value())
    workload.rejections.append(b"\xff not a rejection")

    # Failover: a new leader rebuilt from the log takes epoch 2 ...
    new = Dispatcher(CONFIG)
    new.apply_all(workload.events())
    b = Driver(new, workload, clock)
    b.running = dict(a.running)
    b.do(lambda core, now: core.begin_epoch(2, now, holder="node-b"))
    b.do(lambda core, now: core.resume(now))
    # ... while the old one, a zombie, still writes: its events come after the election.
    zombie_running = sorted(
        job_id
        for job_id in a.running
        if (job := old.job_view(job_id)) is not None and job.status.value == "running"
    )
    if zombie_running:
        a.ack(zombie_running[0], "zombie result")
    a.submit("job-zombie", "image.resize", "alice")
    # A transaction the broker aborted (never read by read_committed).
    try:
        aborted_events = old.submit(
            SubmitRequest(id="job-aborted", exec="image.resize", payload=None), a.now()
        )
    except Rejected:
        aborted_events = []
    workload.aborted.append(LogRecord(1, aborted_events or old.tick(a.now())))

    workload.leader = new
    # The new leader carries on: workers re-join, more work, acks.
    b.do(lambda core, now: core.join("w-img-1", ["job.assign.image.*"], now))
    b.do(lambda core, now: core.join("w-txt-2", ["job.assign.text.>"], now))
    b.do(lambda core, now: core.grant_credit("w-txt-2", 5, now))
    b.do(lambda core, now: core.grant_credit("w-img-1", 5, now))
    for index in range(12, 18):
        b.submit(f"job-{index:02d}", ("image.resize", "text.index.full")[index % 2], "carol")
    for job_id in sorted(b.running):
        job = new.job(job_id)
        if job is not None and job.status.value == "running":
            if int(job_id[-2:]) % 4 == 0:
                b.fail(job_id)
            else:
                b.ack(job_id, {"job": job_id})
    if prune:
        finished = [
            job.updated_at for job in new.jobs() if job.status.value in ("succeeded", "cancelled")
        ]
        before = sorted(finished)[len(finished) // 2]
        b.do(lambda core, now: core.prune(before, now))
        gone = sorted({f"job-{i:02d}" for i in range(18)} - {job.id for job in new.jobs()})
        # A pruned id submitted again starts a new life.
        b.submit(gone[0], "image.crop", "dave")
    b.do(lambda core, now: core.tick(now), step=20.0)
    return workload


def _cancel(job_id: str, by: str | None, core: Dispatcher, now: float) -> list[Event]:
    return core.cancel(job_id, now, by=by, reason="test")


def random_workload(seed: int, steps: int = 300) -> Workload:
    """Random commands against one leader (with failovers and prunes) for property tests."""
    rng = random.Random(seed)
    # Job controls (a retry policy of its own, an expiry, a time limit, cancels of queued and
    # running jobs), drawn apart so the rest of the workload stays what it was.
    controls = random.Random(seed + 1_000)
    clock = [1_800_000_000.0]
    core = Dispatcher(CONFIG)
    workload = Workload(leader=core)
    driver = Driver(core, workload, clock)
    driver.begin(1)
    workers = ["w1", "w2", "w3"]
    for worker in workers:
        driver.join(worker, "job.assign.>")
    epoch = 1
    next_id = 0
    for _ in range(steps):
        if controls.random() < 0.05 and driver.running:
            cancel = functools.partial(
                _cancel, controls.choice(sorted(driver.running)), controls.choice([None, "ops"])
            )
            with contextlib.suppress(Rejected):  # it ended meanwhile
                driver.do(cancel)
        choice = rng.random()
        try:
            if choice < 0.30:
                driver.submit(
                    f"r{next_id % 40}-{seed}",
                    rng.choice(["a.x", "a.y", "b.z"]),
                    rng.choice(["c1", "c2"]),
                    max_attempts=rng.choice([None, 1, 2, 3]),
                    # Drawn apart, so the rest of the workload stays what it was.
                    retry=controls.choice([None, None, {"delay_s": 2.0, "jitter": 0.5}]),
                    ttl_s=controls.choice([None, None, None, 5.0, 40.0]),
                    max_run_s=controls.choice([None, None, None, 3.0, 30.0]),
                )
                next_id += 1
            elif choice < 0.40:
                worker = rng.choice(workers)
                driver.credit(worker, rng.randint(1, 4))
            elif choice < 0.70 and driver.running:
                job_id = rng.choice(sorted(driver.running))
                roll = rng.random()
                if roll < 0.6:
                    driver.ack(job_id, rng.choice([None, 1, "x", {"k": [1, 2]}]))
                elif roll < 0.8:
                    driver.fail(job_id, retryable=rng.random() < 0.7)
                else:
                    driver.heartbeat(job_id)
            elif choice < 0.78:
                driver.tick(rng.choice([1.0, 12.0, 50.0]))
            elif choice < 0.84:
                queued = sorted(j.id for j in core.jobs() if j.status.value == "queued")
                if queued:
                    job_id = rng.choice(queued)
                    driver.cancel(job_id)
            elif choice < 0.88:
                dead = sorted(j.id for j in core.jobs() if j.status.value == "dead")
                if dead:
                    job_id = rng.choice(dead)
                    driver.redrive(job_id)
            elif choice < 0.92:
                driver.prune(clock[0] - rng.choice([5.0, 30.0, 100.0]))
            elif choice < 0.98:
                worker = rng.choice(workers)
                if core.worker(worker) is not None:
                    driver.lose(worker)
                driver.join(worker, "job.assign.>")
            else:
                # Failover: a new core rebuilt from the log, a zombie write, then the new one.
                epoch += 1
                fresh = Dispatcher(CONFIG)
                fresh.apply_all(workload.events())
                new_driver = Driver(fresh, workload, clock)
                new_driver.running = dict(driver.running)
                new_driver.begin(epoch)
                driver.tick(60.0)  # the zombie's decisions, logged after the election
                core, driver = fresh, new_driver
                workload.leader = core
        except Rejected:
            continue
        driver.running = {
            job_id: held
            for job_id, held in driver.running.items()
            if (job := core.job_view(job_id)) is not None
            and job.status.value == "running"
            and job.attempts == held[0]
        }
    return workload

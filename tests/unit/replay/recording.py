"""A recorded run for the replay's tests: the pure core driven the way the leader drives it.

Not the replay's own simulation: a discrete-time leader loop (an iteration every 5-20 ms,
as long as `api/leader.py`'s take with their commit) takes what arrived since its last
iteration (worker answers and credit, each `LATENCY_S` after the worker sent it; submissions),
submits the new jobs in one batch and ticks. Workers receive an assignment `LATENCY_S` after the
iteration that made it, run the job for its drawn time, answer, and grant the slot back as a
message of its own up to `CREDIT_LAG_S` later (as the WebSocket transport does). The job mix
is the demo's (echo jobs, a flaky one retried, a stalled one that times out once, one that
fails for good) plus a few heavier execs, from three tenants, one of which floods in a burst.

A planned job may also be cancelled at a planned time (`PlannedJob.cancel_at`): queued, it
ends at once; running, its worker is told to stop and, if it heeds the cancel
(`PlannedJob.stop_s`), stops that long after the message reaches it and answers with a
failure (the SDK's `cancelled: ...`). An attempt stopped by its hard time limit is told to stop
too: it stops at once and answers (refused). A stopped attempt's planned answer and credit
never come; the credit follows the stop's answer instead. An attempt may report its progress
with a job heartbeat every `Behaviour.progress_every_s`, and an operator may pause and resume
an exec pattern or a client at planned times (`PlannedControl`), and set and remove runtime
limits (`PlannedLimit`).
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatch.core.commands import SubmitRequest
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.errors import Rejected
from dispatch.core.events import (
    Assigned,
    Cancelled,
    CancelRequested,
    Completed,
    DeadLettered,
    Event,
    Expired,
    Reassigned,
    Requeued,
)
from dispatch.core.job import DeadReason, RequeueReason
from dispatch.core.leases import seeded_lease_tokens
from dispatch.delta import tables as t
from dispatch.settings import DispatcherSettings
from dispatch.streaming.decode import KafkaRow, LoggedEvent, event_bronze_row
from dispatch.streaming.delta_commits import DeltaCommits
from dispatch.warehouse import Warehouse

ITERATION_S = (0.005, 0.02)
LATENCY_S = 0.002
CREDIT_LAG_S = 0.015
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
RECORDED_SETTINGS = DispatcherSettings(
    ack_timeout_s=2.0, max_ack_timeout_s=8.0, default_cap=100, caps={"acme": 6}
)
WORKERS = {"w-1": ("job.assign.>",), "w-2": ("job.assign.>",), "w-3": ("job.assign.demo.>",)}
SLOTS = 2


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How one attempt of a job runs on its worker: seconds, then ack / fail / nothing."""

    run_s: float
    answer: str  # "ack", "fail", "fail_permanent", "stall"
    progress_every_s: float | None = None
    """Its worker heartbeats the job with a progress report this often (None: never)."""


@dataclass(frozen=True, slots=True)
class PlannedControl:
    """An operator's pause (`pause=True`) or resume of an exec pattern or a client."""

    at: float
    pause: bool
    scope: str
    target: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PlannedLimit:
    """An operator's runtime limit set (`knobs`: max_inflight, rate, burst) or removed
    (`knobs` None) on a client, an exec pattern or a key."""

    at: float
    scope: str
    target: str
    knobs: dict[str, Any] | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PlannedJob:
    at: float
    request: SubmitRequest
    attempts: tuple[Behaviour, ...]
    cancel_at: float | None = None
    """When a client cancels it (None: never)."""
    stop_s: float | None = None
    """How long its worker takes to stop it once a cancel reaches it (None: it does not)."""


CANCELLED_BY = "ops-key"
CANCEL_REASON = "not needed any more"
STOP_ERROR = "cancelled: cancel_requested"


def job_mix(seed: int = 7, duration_s: float = 120.0, *, timeouts: bool = True) -> list[PlannedJob]:
    """Arrivals over `duration_s`: a steady mix from three tenants, and a burst from acme.
    Without `timeouts`, no attempt outlives its deadline (reports run under 2 s, the stalling
    job does not stall)."""
    rng = random.Random(seed)
    jobs: list[PlannedJob] = []
    counter = itertools.count()

    def add(
        at: float, exec_name: str, client: str, attempts: tuple[Behaviour, ...], **extra: Any
    ) -> None:
        job_id = f"{exec_name.rsplit('.', maxsplit=1)[-1]}-{next(counter)}"
        request = SubmitRequest(id=job_id, exec=exec_name, payload=None, client_id=client, **extra)
        jobs.append(PlannedJob(START + at, request, attempts))

    for client, rate in (("acme", 1.5), ("globex", 1.0), ("initech", 0.7)):
        at = rng.expovariate(rate)
        while at < duration_s:
            kind = rng.random()
            if kind < 0.45:
                add(at, "demo.echo", client, (Behaviour(rng.uniform(0.02, 0.08), "ack"),))
            elif kind < 0.75:
                add(at, "image.resize", client, (Behaviour(rng.uniform(0.2, 1.5), "ack"),))
            elif kind < 0.9:
                longest = 4.0 if timeouts else 1.9
                add(at, "report.build", client, (Behaviour(rng.uniform(1.0, longest), "ack"),))
            elif kind < 0.95:
                add(
                    at,
                    "demo.flaky",
                    client,
                    (Behaviour(0.1, "fail"), Behaviour(rng.uniform(0.05, 0.2), "ack")),
                )
            elif kind < 0.98:
                # Hangs past its 2 s deadline once (no heartbeat), then runs in time.
                add(
                    at,
                    "demo.stall",
                    client,
                    (
                        Behaviour(3.0, "stall" if timeouts else "ack"),
                        Behaviour(rng.uniform(0.5, 1.0), "ack"),
                    ),
                    max_attempts=3,
                )
            else:
                add(at, "demo.fail", client, (Behaviour(0.05, "fail_permanent"),))
            at += rng.expovariate(rate)
    for n in range(60):  # acme floods: 60 image jobs at once
        add(40.0 + n * 0.001, "image.resize", "acme", (Behaviour(rng.uniform(0.2, 1.0), "ack"),))
    jobs.sort(key=lambda job: job.at)
    return jobs


@dataclass
class _Leader:
    core: Dispatcher
    inbox: list[tuple[float, int, str, tuple[Any, ...]]] = field(default_factory=list)
    order: Iterator[int] = field(default_factory=itertools.count)
    events: list[Event] = field(default_factory=list)
    timing: random.Random = field(default_factory=lambda: random.Random(11))
    attempts: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    """(job, attempt) -> (lease, worker) of every assignment."""
    stopped: set[tuple[str, int]] = field(default_factory=set)
    """Attempts their worker stopped: their planned answer and credit never come."""

    def stop(self, job_id: str, attempt: int, after_s: float) -> None:
        """The worker stops the attempt `after_s` after it learns (one latency from now),
        answers, and grants its slot back."""
        self.stopped.add((job_id, attempt))
        lease, worker_id = self.attempts[(job_id, attempt)]
        answered = self.now + LATENCY_S + after_s + LATENCY_S
        self.arrive(answered, "stop", job_id, attempt, lease)
        self.arrive(answered + self.timing.uniform(0.0, CREDIT_LAG_S), "free", worker_id)

    now: float = 0.0

    def arrive(self, at: float, kind: str, *args: Any) -> None:
        heapq.heappush(self.inbox, (at, next(self.order), kind, args))


def record_run(
    jobs: list[PlannedJob],
    settings: DispatcherSettings = RECORDED_SETTINGS,
    seed: int = 1,
    controls: Sequence[PlannedControl | PlannedLimit] = (),
) -> list[Event]:
    """Every event the leader logged, in log order, until every job ended."""
    config = settings.core_config()
    leader = _Leader(Dispatcher(config, lease_token=seeded_lease_tokens(seed)))
    behaviours = {job.request.id: job.attempts for job in jobs}
    stops = {job.request.id: job.stop_s for job in jobs}
    for job in jobs:
        leader.arrive(job.at, "submit", job.request)
        if job.cancel_at is not None:
            leader.arrive(job.cancel_at, "cancel", job.request.id)
    for control in controls:
        if isinstance(control, PlannedLimit):
            kind = "remove_limit" if control.knobs is None else "set_limit"
            leader.arrive(
                control.at, kind, control.scope, control.target, control.knobs, control.reason
            )
            continue
        kind = "pause" if control.pause else "unpause"
        leader.arrive(control.at, kind, control.scope, control.target, control.reason)
    for worker_id in WORKERS:
        leader.arrive(START - 1.0, "join", worker_id)
    now = START - 1.0
    pending = len(jobs)
    finished: set[str] = set()
    next_heartbeat = now
    while pending and now < START + 3600:
        leader.now = now
        if now >= next_heartbeat:  # workers heartbeat every 5 s, so none is lost for silence
            next_heartbeat = now + 5.0
            for worker_id in WORKERS:
                leader.arrive(now, "heartbeat", worker_id)
        due: list[tuple[str, tuple[Any, ...]]] = []
        while leader.inbox and leader.inbox[0][0] <= now:
            _, _, kind, args = heapq.heappop(leader.inbox)
            due.append((kind, args))
        submissions = [args[0] for kind, args in due if kind == "submit"]
        out: list[Event] = []
        for kind, args in due:
            out += _command(leader, kind, args, now)
        if submissions:
            out += leader.core.submit_many(submissions, now)
        out += leader.core.tick(now)
        for event in out:
            if isinstance(event, Assigned | Reassigned):
                leader.attempts[(event.job_id, event.attempt)] = (event.lease, event.worker_id)
                _run_attempt(leader, event, behaviours[event.job_id], now)
            elif isinstance(event, CancelRequested):
                stop_s = stops[event.job_id]
                if stop_s is not None:
                    leader.stop(event.job_id, event.attempt, stop_s)
            elif (isinstance(event, Requeued) and event.reason is RequeueReason.TIME_LIMIT) or (
                isinstance(event, DeadLettered) and event.reason is DeadReason.TIME_LIMIT
            ):
                leader.stop(event.job_id, event.attempt, 0.0)
            ended = Completed | DeadLettered | Cancelled | Expired
            if isinstance(event, ended) and event.job_id not in finished:
                finished.add(event.job_id)
                pending -= 1
        leader.events += out
        now = round(now + leader.timing.uniform(*ITERATION_S), 6)
    return leader.events


def _command(leader: _Leader, kind: str, args: tuple[Any, ...], now: float) -> list[Event]:
    core = leader.core
    if kind == "join":
        return core.join(args[0], WORKERS[args[0]], now) + core.grant_credit(args[0], SLOTS, now)
    if kind == "credit":
        worker_id, job_id, attempt = args
        if (job_id, attempt) in leader.stopped:
            return []  # the stop's own credit returns the slot
        return core.grant_credit(worker_id, 1, now)
    if kind == "free":
        return core.grant_credit(args[0], 1, now)
    if kind == "heartbeat":
        return core.worker_heartbeat(args[0], now)
    if kind == "pause":
        scope, target, reason = args
        return core.pause(scope, target, now, by=CANCELLED_BY, reason=reason)
    if kind == "unpause":
        return core.unpause(args[0], args[1], now, by=CANCELLED_BY)
    if kind == "set_limit":
        scope, target, knobs, reason = args
        return core.set_limit(scope, target, now, **knobs, by=CANCELLED_BY, reason=reason)
    if kind == "remove_limit":
        return core.remove_limit(args[0], args[1], now, by=CANCELLED_BY)
    if kind == "progress":
        job_id, attempt, lease, worker_id, step, steps = args
        if (job_id, attempt) in leader.stopped:
            return []
        report = {"done": step, "total": steps, "message": f"step {step} of {steps}"}
        try:
            return core.heartbeat(job_id, attempt, lease, now, worker_id=worker_id, progress=report)
        except Rejected:
            return []  # it timed out meanwhile
    if kind == "cancel":
        try:
            return core.cancel(args[0], now, by=CANCELLED_BY, reason=CANCEL_REASON)
        except Rejected:
            return []  # it ended before its cancel came
    if kind not in ("ack", "fail", "fail_permanent", "stop"):
        return []
    job_id, attempt, lease = args
    if kind != "stop" and (job_id, attempt) in leader.stopped:
        return []  # stopped before it finished: this answer never comes
    try:
        if kind == "stop":
            return core.fail(job_id, attempt, lease, now, error=STOP_ERROR, retryable=False)
        if kind == "ack":
            return core.ack(job_id, attempt, lease, now)
        return core.fail(job_id, attempt, lease, now, retryable=kind == "fail")
    except Rejected:
        return []  # a late answer for an attempt that timed out: refused, as by the leader


def _run_attempt(
    leader: _Leader, event: Assigned | Reassigned, plan: tuple[Behaviour, ...], now: float
) -> None:
    behaviour = plan[min(event.attempt, len(plan)) - 1]
    done = now + LATENCY_S + behaviour.run_s
    answer = "ack" if behaviour.answer == "stall" else behaviour.answer
    every = behaviour.progress_every_s
    if every is not None:
        steps = int(behaviour.run_s / every)
        for step in range(1, steps):
            at = now + LATENCY_S + step * every + LATENCY_S
            leader.arrive(at, "progress", event.job_id, event.attempt, event.lease,
                          event.worker_id, step, steps)  # fmt: skip
    # The answer reaches the leader one latency later; the credit for the slot follows it.
    leader.arrive(done + LATENCY_S, answer, event.job_id, event.attempt, event.lease)
    lag = leader.timing.uniform(0.0, CREDIT_LAG_S)
    leader.arrive(done + LATENCY_S + lag, "credit", event.worker_id, event.job_id, event.attempt)


def write_events_table(
    warehouse: Warehouse, events: list[Event], *, group: str = "default", batch_rows: int = 400
) -> None:
    """`events` written to the Delta `events` table as the fold writes them: one record per
    leader iteration (the events of one instant), its rows made by the fold's own
    `event_bronze_row`, appended by the fold's writer (`DeltaCommits.append`) a batch at a
    time, in the table's schema and partitioning."""
    from deltalake import write_deltalake

    write_deltalake(
        warehouse.table(t.EVENTS),
        t.empty_table(t.EVENTS),
        partition_by=t.PARTITIONS[t.EVENTS],
        storage_options=warehouse.storage_options or None,
    )
    rows: list[dict[str, Any]] = []
    offset = -1
    index = 0
    last_at: float | None = None
    for event in events:
        if event.at != last_at:
            offset, index, last_at = offset + 1, 0, event.at
        record = KafkaRow(
            "dispatch.events",
            0,
            offset,
            group.encode(),
            b"",
            dt.datetime.fromtimestamp(event.at, dt.UTC),
        )
        logged = LoggedEvent(0, offset, index, group, event.epoch, event)
        rows.append(event_bronze_row(logged, record, admitted=True, batch_id=0))
        index += 1
    commits = DeltaCommits(warehouse)
    for batch, start in enumerate(range(0, len(rows), batch_rows)):
        commits.append(
            t.EVENTS,
            t.arrow_rows(t.EVENTS, rows[start : start + batch_rows]),
            app_id="replay-test",
            version=batch,
            metadata="{}",
        )

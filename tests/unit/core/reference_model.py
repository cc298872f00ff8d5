"""A small, obviously-correct model of the dispatcher, for the stateful property test.

It is written for clarity, not speed: plain dicts and lists, a regex subject matcher, and
linear scans. It does not pick assignments itself (the core decides among equally valid
choices, e.g. which client's turn it is); instead it *checks* every event the core emits
against the rules of docs/spec.md before folding it, and predicts every outcome that the rules fix
(rejections, requeue or dead-letter, deadlines, queue positions).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from dispatch.core import (
    Assigned,
    Cancelled,
    CancelRequested,
    Completed,
    CoreConfig,
    CreditGranted,
    DeadLettered,
    Enqueued,
    Event,
    Expired,
    JobHeartbeat,
    LeaderElected,
    LimitRemoved,
    LimitSet,
    Paused,
    Pruned,
    Reassigned,
    Redriven,
    Requeued,
    Resumed,
    WorkerHeartbeat,
    WorkerJoined,
    WorkerLost,
)
from dispatch.core.progress import PROGRESS_EVERY_S
from dispatch.core.retry import RetryPolicy


def pattern_matches(pattern: str, subject: str) -> bool:
    """NATS matching by regex: `*` is one token, a final `>` is one or more tokens."""
    parts = []
    for token in pattern.split("."):
        if token == "*":
            parts.append(r"[^.]+")
        elif token == ">":
            parts.append(r".+")
        else:
            parts.append(re.escape(token))
    return re.fullmatch(r"\.".join(parts), subject) is not None


def backoff(first: float, attempt: int, config: CoreConfig) -> float:
    return min(
        first * config.backoff_multiplier ** (attempt - 1),
        max(config.max_ack_timeout_s, first),
    )


def retry_delay(policy: RetryPolicy, job_id: str, failed_attempt: int) -> float:
    """The spec's delay before the attempt after `failed_attempt`: delay_s * multiplier^(n-1),
    at most max_delay_s, less a jitter share drawn from (job id, attempt)."""
    if policy.delay_s == 0:
        return 0.0
    base = min(policy.delay_s * policy.multiplier ** (failed_attempt - 1), policy.max_delay_s)
    digest = hashlib.blake2b(f"{job_id}\x00{failed_attempt}".encode(), digest_size=8).digest()
    draw = int.from_bytes(digest, "big") / 2.0**64
    delay = base * (1 - policy.jitter * draw)
    assert base * (1 - policy.jitter) <= delay <= base
    return delay


@dataclass
class MJob:
    id: str
    client: str
    exec: str
    priority: int
    not_before: float | None
    max_attempts: int
    timeout_s: float
    seq: int
    updated_at: float
    status: str = "queued"
    attempts: int = 0
    worker: str | None = None
    lease: str | None = None
    deadline: float | None = None
    result: Any = None
    error: str | None = None
    dead_reason: str | None = None
    retry: RetryPolicy | None = None
    expires_at: float | None = None
    submitted_at: float = 0.0
    max_run_s: float | None = None
    run_limit_at: float | None = None
    cancel_requested_at: float | None = None
    progress: dict[str, Any] | None = None
    key: str | None = None


Knobs = tuple[int | None, float | None, int | None]
"""(max_inflight, rate, burst) of a limit."""
SLACK = 1e-9


@dataclass
class MBucket:
    """A token bucket: at most `burst` tokens, `rate` more per second, one per start."""

    rate: float
    burst: int
    tokens: float
    at: float

    def level(self, now: float) -> float:
        return min(float(self.burst), self.tokens + (now - self.at) * self.rate)


@dataclass
class MWorker:
    id: str
    subjects: tuple[str, ...]
    last_seen: float
    owner: str | None = None
    credit: int = 0
    running: list[str] = field(default_factory=list)


class Model:
    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self.jobs: dict[str, MJob] = {}
        self.workers: dict[str, MWorker] = {}
        self.clock = 0.0
        self.epoch = 0
        self.next_seq = 1
        self.front_seq = -1
        self.leases: set[str] = set()
        self.retry_after: float | None = None
        """The delay the worker asked for in the `fail` being absorbed (None: the policy)."""
        self.cancel_by: str | None = None
        self.cancel_reason = ""
        """Who asked for the `cancel`/`cancel_where` being absorbed, and why."""
        self.pauses: dict[tuple[str, str], Paused] = {}
        """The pauses in force, by (scope, target)."""
        self.pause_request: tuple[str | None, str] = (None, "")
        """`by` and `reason` of the `pause`/`unpause` being absorbed."""
        self.progress_sent: dict[str, Any] | None = None
        """The (valid, normalised) report of the `heartbeat` being absorbed."""
        self.limits: dict[tuple[str, str], LimitSet] = {}
        """The runtime limits in force, by (scope, target), in the order they were set."""
        self.limit_request: tuple[str | None, str, Knobs | None] = (None, "", None)
        """`by`, `reason` and the knobs of the `set_limit`/`remove_limit` being absorbed."""
        self.buckets: dict[tuple[str, str], MBucket] = {}
        """Rate buckets: ("client", id), ("exec", pattern), ("key", key); made full when
        first needed."""
        self.starts: dict[tuple[str, str], list[float]] = {}
        """Start times under each rate bucket since its knobs last changed."""

    # --- questions the rules answer -------------------------------------------------------

    def cap(self, client: str) -> int:
        knobs = self.knobs("client", client)
        if knobs is not None and knobs[0] is not None:
            return knobs[0]
        return self.config.caps.get(client, self.config.default_cap)

    def knobs(self, scope: str, target: str) -> Knobs | None:
        """The limit in force on (scope, target): the runtime one, else the settings'."""
        event = self.limits.get((scope, target))
        if event is not None:
            return (event.max_inflight, event.rate, event.burst)
        limit = self.config.limits.get(scope, {}).get(target)
        return None if limit is None else (limit.max_inflight, limit.rate, limit.burst)

    def targets(self, scope: str) -> set[str]:
        return set(self.config.limits.get(scope, {})) | {t for s, t in self.limits if s == scope}

    def key_knobs(self, key: str) -> Knobs | None:
        """A key's limit: its exact one, else the longest pattern it starts with."""
        targets = self.targets("key")
        if key in targets:
            return self.knobs("key", key)
        prefixes = [t[:-1] for t in targets if t.endswith("*") and key.startswith(t[:-1])]
        return self.knobs("key", max(prefixes, key=len) + "*") if prefixes else None

    def limits_over(self, job: MJob) -> list[tuple[tuple[str, str], Knobs, int]]:
        """(bucket name, knobs, running count) of every limit over the job."""
        running = [j for j in self.jobs.values() if j.status == "running"]
        out: list[tuple[tuple[str, str], Knobs, int]] = []
        knobs = self.knobs("client", job.client)
        if knobs is not None:
            out.append((("client", job.client), knobs, self.inflight(job.client)))
        for pattern in sorted(self.targets("exec")):
            if pattern_matches(pattern, job.exec):
                count = sum(1 for j in running if pattern_matches(pattern, j.exec))
                knobs = self.knobs("exec", pattern)
                assert knobs is not None
                out.append((("exec", pattern), knobs, count))
        if job.key is not None:
            knobs = self.key_knobs(job.key)
            if knobs is not None:
                count = sum(1 for j in running if j.key == job.key)
                out.append((("key", job.key), knobs, count))
        return out

    def bucket(self, name: tuple[str, str], knobs: Knobs) -> MBucket | None:
        _, rate, burst = knobs
        if rate is None or burst is None:
            return None
        bucket = self.buckets.get(name)
        if bucket is None:
            bucket = self.buckets[name] = MBucket(rate, burst, float(burst), self.clock)
        return bucket

    def limits_admit(self, job: MJob, again: bool = False) -> bool:
        """Every limit over the job has room for one more start now (`again`: the job is
        running and counted already: a reassignment)."""
        if again and self.inflight(job.client) - 1 >= self.cap(job.client):
            return False
        for name, knobs, count in self.limits_over(job):
            if knobs[0] is not None and count - again >= knobs[0]:
                return False
            bucket = self.bucket(name, knobs)
            if bucket is not None and bucket.level(self.clock) < 1 - SLACK:
                return False
        return True

    def start(self, job: MJob) -> None:
        """A start under the job's rate limits: take a token, and check against the start
        history that no window held more than burst + rate * its length."""
        for name, knobs, _ in self.limits_over(job):
            bucket = self.bucket(name, knobs)
            if bucket is None:
                continue
            bucket.tokens = bucket.level(self.clock) - 1
            bucket.at = self.clock
            history = self.starts.setdefault(name, [])
            history.append(self.clock)
            for first in history:
                inside = sum(1 for t in history if t >= first)
                allowed = bucket.burst + bucket.rate * (self.clock - first) + 1e-6
                assert inside <= allowed, f"{name}: {inside} starts since {first} > {allowed}"

    def retune(self, name: tuple[str, str], knobs: Knobs | None) -> None:
        """New knobs for a bucket: the tokens stay (at most the new burst), a full one
        stays full; no rate: no bucket."""
        bucket = self.buckets.get(name)
        self.starts.pop(name, None)
        if bucket is None:
            return
        if knobs is None or knobs[1] is None or knobs[2] is None:
            del self.buckets[name]
            return
        level = bucket.level(self.clock)
        full = level >= min(knobs[2], bucket.burst)
        bucket.tokens = float(knobs[2]) if full else level
        bucket.at = self.clock
        bucket.rate, bucket.burst = knobs[1], knobs[2]

    def limit_changed(self, scope: str, target: str) -> None:
        if scope != "key":
            self.retune((scope, target), self.knobs(scope, target))
            return
        for name in [name for name in self.buckets if name[0] == "key"]:
            bucket = self.buckets[name]
            knobs = self.key_knobs(name[1])
            if knobs is None or (knobs[1], knobs[2]) != (bucket.rate, bucket.burst):
                self.retune(name, knobs)

    def inflight(self, client: str) -> int:
        return sum(1 for j in self.jobs.values() if j.status == "running" and j.client == client)

    def is_ready(self, job: MJob) -> bool:
        return job.status == "queued" and (job.not_before is None or job.not_before <= self.clock)

    def is_expired(self, job: MJob) -> bool:
        return job.expires_at is not None and job.expires_at <= self.clock

    def policy(self, job: MJob) -> RetryPolicy:
        return job.retry if job.retry is not None else self.policy_for_exec(job.exec)

    def policy_for_exec(self, exec_name: str) -> RetryPolicy:
        for pattern, policy in self.config.retry_by_exec:
            if pattern_matches(pattern, exec_name):
                return policy
        return self.config.retry

    def retry_at(self, job: MJob, retry_after: float | None) -> float | None:
        if retry_after is None:
            delay = retry_delay(self.policy(job), job.id, job.attempts)
        else:
            delay = retry_after
        return self.clock + delay if delay > 0 else None

    def matches(self, worker: MWorker, exec_name: str) -> bool:
        return any(pattern_matches(p, f"job.assign.{exec_name}") for p in worker.subjects)

    def best_worker(self, exec_name: str, exclude: str | None = None) -> MWorker | None:
        candidates = [
            w
            for w in self.workers.values()
            if w.credit > 0 and w.id != exclude and self.matches(w, exec_name)
        ]
        if not candidates:
            return None
        return min(candidates, key=lambda w: (len(w.running), -w.credit, w.id))

    def held(self, job: MJob) -> bool:
        """A pause in force holds the job: one of its exec, or of its client."""
        return ("client", job.client) in self.pauses or any(
            scope == "exec" and pattern_matches(target, job.exec) for scope, target in self.pauses
        )

    def servable(self, job: MJob) -> bool:
        return (
            self.is_ready(job)
            and not self.is_expired(job)
            and self.inflight(job.client) < self.cap(job.client)
            and not self.held(job)
            and self.limits_admit(job)
        )

    def silent(self, worker: MWorker) -> bool:
        expiry = self.config.worker_expiry_s
        return expiry is not None and worker.last_seen + expiry <= self.clock

    def timeout(self, job: MJob, attempt: int) -> float:
        """The ack timeout of `attempt` (what a heartbeat extends the deadline by)."""
        return backoff(job.timeout_s, attempt, self.config)

    def first_window(self, job: MJob, attempt: int) -> float:
        """From the start of `attempt` to its first deadline: its timeout, or the hard
        limit if that is shorter."""
        timeout = self.timeout(job, attempt)
        return timeout if job.max_run_s is None else min(timeout, job.max_run_s)

    def max_run_for_exec(self, exec_name: str) -> float | None:
        for pattern, seconds in self.config.max_run_by_exec:
            if pattern_matches(pattern, exec_name):
                return seconds
        return self.config.max_run_s

    def at_time_limit(self, job: MJob) -> bool:
        """The running job's deadline is its hard limit: reaching it is `time_limit`."""
        return (
            job.run_limit_at is not None
            and job.deadline is not None
            and job.run_limit_at <= job.deadline <= self.clock
        )

    def cancel_candidates(
        self,
        exec_pattern: str | None,
        client: str | None,
        statuses: frozenset[str],
    ) -> list[MJob]:
        """What `cancel_where` picks, oldest submission first (before its limit)."""
        chosen = [
            job
            for job in self.jobs.values()
            if job.status in statuses
            and job.cancel_requested_at is None
            and (client is None or job.client == client)
            and (exec_pattern is None or pattern_matches(exec_pattern, job.exec))
        ]
        return sorted(chosen, key=lambda job: (job.submitted_at, job.id))

    # --- checks after a command -----------------------------------------------------------

    def check_work_conserving(self) -> None:
        for job in self.jobs.values():
            if self.servable(job):
                assert self.best_worker(job.exec) is None, (
                    f"{job.id} waits although worker {self.best_worker(job.exec)} could take it"
                )

    def check_timers_done(self) -> None:
        for job in self.jobs.values():
            if job.status == "running":
                assert job.deadline is not None and job.deadline > self.clock, job
                assert (job.run_limit_at is None) == (job.max_run_s is None), job
        for worker in self.workers.values():
            assert not self.silent(worker), f"silent worker {worker.id} was kept"
        for job in self.jobs.values():
            assert not (job.status == "queued" and self.is_expired(job)), f"{job.id} not expired"

    # --- folding the core's events, each checked against the rules ------------------------

    def absorb(self, event: Event, context: str, subject: str | None = None) -> None:
        """Check `event` is legal here (`context`: which command emitted it; `subject`: the
        job or worker the command was about), then fold it."""
        assert event.epoch == self.epoch, event
        assert event.at == self.clock, (event, self.clock)
        handler = getattr(self, f"_absorb_{event.type}")
        handler(event, context, subject)

    def _take_lease(self, lease: str) -> None:
        assert lease not in self.leases, f"lease {lease} reused"
        epoch, dot, token = lease.partition(".")
        assert (epoch, dot) == (str(self.epoch), "."), lease
        assert len(token) == 32 and int(token, 16) >= 0, f"not 128 random bits: {lease}"
        self.leases.add(lease)

    def _absorb_enqueued(self, event: Enqueued, context: str, subject: str | None) -> None:
        assert context == "submit" and subject in (None, event.job_id)
        old = self.jobs.get(event.job_id)
        assert old is None, f"{event.job_id} enqueued twice"
        assert event.seq == self.next_seq
        self.next_seq += 1
        self.jobs[event.job_id] = MJob(
            id=event.job_id,
            client=event.client_id,
            exec=event.exec,
            priority=event.priority,
            not_before=event.not_before,
            max_attempts=event.max_attempts,
            timeout_s=event.timeout_s,
            seq=event.seq,
            updated_at=event.at,
            retry=event.retry,
            expires_at=event.expires_at,
            submitted_at=event.at,
            max_run_s=event.max_run_s,
            key=event.key,
        )

    def _absorb_assigned(self, event: Assigned, context: str, subject: str | None) -> None:
        job = self.jobs[event.job_id]
        assert self.is_ready(job), f"{job.id} assigned while not ready: {job}"
        assert not self.is_expired(job), f"{job.id} started at or after its expiry: {job}"
        assert not self.held(job), f"{job.id} started while paused: {self.pauses}"
        assert event.attempt == job.attempts + 1 <= job.max_attempts
        worker = self.workers[event.worker_id]
        assert worker.credit > 0, "assigned to a worker without credit"
        assert self.matches(worker, job.exec), "assigned to a worker whose subjects do not match"
        assert self.inflight(job.client) < self.cap(job.client), "client over its cap"
        assert self.limits_admit(job), f"{job.id} started beyond a limit: {self.limits}"
        best = self.best_worker(job.exec)
        assert best is not None and best.id == worker.id, f"chose {worker.id}, the rule says {best}"
        for other in self.jobs.values():
            if other.exec != job.exec or not self.servable(other) or other is job:
                continue
            if other.key is not None and self.key_knobs(other.key) is not None:
                # Its key's held jobs come back to their lanes a group at a time.
                continue
            assert other.priority <= job.priority, f"{other.id} has a higher priority"
            if other.priority == job.priority and other.client == job.client:
                assert other.seq > job.seq, f"{other.id} is ahead of {job.id} in its queue"
        assert event.deadline == event.at + self.first_window(job, event.attempt)
        self._take_lease(event.lease)
        worker.credit -= 1
        worker.running.append(job.id)
        job.status = "running"
        job.attempts = event.attempt
        job.worker = worker.id
        job.lease = event.lease
        job.deadline = event.deadline
        job.updated_at = event.at
        job.run_limit_at = None if job.max_run_s is None else event.at + job.max_run_s
        self._check_limit(job)
        self.start(job)

    def _check_limit(self, job: MJob) -> None:
        """No deadline past the attempt's hard limit (there is no failover here)."""
        if job.run_limit_at is not None:
            assert job.deadline is not None and job.deadline <= job.run_limit_at, job

    def _absorb_reassigned(self, event: Reassigned, context: str, subject: str | None) -> None:
        assert context == "tick"
        job = self.jobs[event.job_id]
        assert job.status == "running" and job.deadline is not None
        assert job.deadline <= self.clock, "reassigned before its deadline"
        assert job.cancel_requested_at is None, "a cancelling job ends cancelled at its deadline"
        assert not self.at_time_limit(job), "an attempt at its time limit is requeued"
        assert self.retry_at(job, None) is None, "reassigned at once despite a retry delay"
        assert not self.is_expired(job), "an expired job starts no new attempt"
        assert not self.held(job), f"{job.id} reassigned while paused: {self.pauses}"
        assert self.limits_admit(job, again=True), f"{job.id} reassigned beyond a limit"
        assert event.previous_worker_id == job.worker
        assert event.attempt == job.attempts + 1 <= job.max_attempts
        previous = self.workers[event.previous_worker_id]
        other = self.best_worker(job.exec, exclude=previous.id)
        if other is not None:
            assert event.worker_id == other.id, f"should prefer {other.id}"
        else:
            # The same worker only with room: its timed-out attempt still holds a slot.
            assert event.worker_id == previous.id and self.matches(previous, job.exec)
            assert previous.credit > 0
        assert event.deadline == event.at + self.first_window(job, event.attempt)
        self._take_lease(event.lease)
        worker = self.workers[event.worker_id]
        if event.worker_id != previous.id:
            previous.running.remove(job.id)
            worker.running.append(job.id)
        worker.credit -= 1
        job.attempts = event.attempt
        job.worker = event.worker_id
        job.lease = event.lease
        job.deadline = event.deadline
        job.updated_at = event.at
        job.run_limit_at = None if job.max_run_s is None else event.at + job.max_run_s
        job.progress = None
        self._check_limit(job)
        self.start(job)

    def _stop(self, job: MJob, worker_id: str, alive: bool) -> None:
        assert job.status == "running" and job.worker == worker_id
        worker = self.workers[worker_id]
        worker.running.remove(job.id)
        if alive:
            worker.last_seen = self.clock
        job.deadline = None
        job.run_limit_at = None
        job.cancel_requested_at = None
        job.updated_at = self.clock

    def _absorb_requeued(self, event: Requeued, context: str, subject: str | None) -> None:
        job = self.jobs[event.job_id]
        assert event.attempt == job.attempts < job.max_attempts
        reason = event.reason.value
        worker = self.workers[event.worker_id]
        assert job.cancel_requested_at is None, "a cancelling job ends cancelled, not requeued"
        if reason == "failed":
            assert context == "fail" and subject == job.id
        elif reason == "worker_lost":
            assert (context == "lose" and subject == worker.id) or (
                context == "tick" and self.silent(worker)
            )
        elif reason == "time_limit":
            assert context == "tick" and self.at_time_limit(job), (event, job)
        else:
            assert reason == "timeout" and context == "tick"
            assert job.deadline is not None and job.deadline <= self.clock
            assert not self.at_time_limit(job), "a deadline at the limit is a time_limit"
            held = self.held(job) or not self.limits_admit(job, again=True)
            if self.retry_at(job, None) is None and not self.is_expired(job) and not held:
                # No delay, not paused: requeued only when nobody could take it at once.
                assert self.best_worker(job.exec, exclude=worker.id) is None
                assert worker.credit <= 0 or not self.matches(worker, job.exec)
        if reason == "worker_lost":
            assert event.not_before is None, "a lost worker's job is requeued at once"
            assert event.retry_after_s is None
        else:
            retry_after = self.retry_after if reason == "failed" else None
            assert event.not_before == self.retry_at(job, retry_after), (event, job)
            assert event.retry_after_s == retry_after, "the worker's own delay is recorded"
        assert event.seq == self.front_seq
        self.front_seq -= 1
        self._stop(job, event.worker_id, alive=reason == "failed")
        job.status = "queued"
        job.worker = None
        job.error = event.error
        job.seq = event.seq
        job.not_before = event.not_before
        job.progress = None

    def _absorb_dead_lettered(self, event: DeadLettered, context: str, subject: str | None) -> None:
        job = self.jobs[event.job_id]
        assert event.attempt == job.attempts
        reason = event.reason.value
        assert job.cancel_requested_at is None, "a cancelling job ends cancelled, not dead"
        if reason == "permanent_failure":
            assert context == "fail" and subject == job.id
        elif reason == "retries_exhausted":
            assert context == "fail" and subject == job.id and job.attempts == job.max_attempts
        elif reason == "worker_lost":
            assert job.attempts == job.max_attempts
            assert (context == "lose" and subject == event.worker_id) or (
                context == "tick" and self.silent(self.workers[event.worker_id])
            )
        elif reason == "time_limit":
            assert context == "tick" and job.attempts == job.max_attempts
            assert self.at_time_limit(job), (event, job)
        else:
            assert reason == "ack_timeout" and context == "tick"
            assert job.attempts == job.max_attempts
            assert job.deadline is not None and job.deadline <= self.clock
            assert not self.at_time_limit(job), "a deadline at the limit is a time_limit"
        self._stop(job, event.worker_id, alive=reason in ("permanent_failure", "retries_exhausted"))
        job.status = "dead"
        job.dead_reason = reason
        job.error = event.error

    def _absorb_completed(self, event: Completed, context: str, subject: str | None) -> None:
        assert context == "ack" and subject == event.job_id
        job = self.jobs[event.job_id]
        assert (event.attempt, event.lease) == (job.attempts, job.lease)
        self._stop(job, event.worker_id, alive=True)
        job.status = "succeeded"
        job.result = event.result
        job.error = None

    def _absorb_job_heartbeat(self, event: JobHeartbeat, context: str, subject: str | None) -> None:
        assert context == "heartbeat" and subject == event.job_id
        job = self.jobs[event.job_id]
        assert job.status == "running" and job.deadline is not None
        if job.cancel_requested_at is not None:
            assert event.deadline == job.deadline, "a heartbeat does not extend a cancel's grace"
        else:
            extended = self.clock + self.timeout(job, job.attempts)
            if job.run_limit_at is not None:
                extended = min(extended, job.run_limit_at)
            assert event.deadline == max(job.deadline, extended)
        sent = self.progress_sent
        last = job.progress
        kept = sent is not None and (last is None or self.clock - last["at"] >= PROGRESS_EVERY_S)
        assert event.progress == (sent if kept else None), (event, sent, last)
        if sent is not None and kept:
            job.progress = {**sent, "at": event.at}
        job.deadline = event.deadline
        self._check_limit(job)
        job.updated_at = event.at
        self.workers[event.worker_id].last_seen = event.at

    def _absorb_cancel_requested(
        self, event: CancelRequested, context: str, subject: str | None
    ) -> None:
        assert (context == "cancel" and subject == event.job_id) or context == "cancel_where"
        job = self.jobs[event.job_id]
        assert job.status == "running" and job.cancel_requested_at is None, job
        assert (event.worker_id, event.attempt) == (job.worker, job.attempts)
        assert job.deadline is not None
        assert event.deadline == min(job.deadline, self.clock + self.config.cancel_grace_s)
        assert (event.by, event.reason) == (self.cancel_by, self.cancel_reason)
        job.cancel_requested_at = event.at
        job.deadline = event.deadline
        job.updated_at = event.at
        # From now on the job shows why the cancel was asked, the start of its final reason.
        asked = self.cancel_reason
        job.error = f"cancelled while running: {asked}" if asked else "cancelled while running"
        self._check_limit(job)

    def _absorb_cancelled(self, event: Cancelled, context: str, subject: str | None) -> None:
        job = self.jobs[event.job_id]
        if event.worker_id is None:
            assert (context == "cancel" and subject == event.job_id) or context == "cancel_where"
            assert job.status == "queued" and event.attempt is None
            assert (event.by, event.reason) == (self.cancel_by, self.cancel_reason)
        else:
            # A running job ends cancelled only after a cancel was asked for, and only when
            # its worker confirms (fails the attempt), its grace passes, or it is lost.
            assert job.status == "running" and job.cancel_requested_at is not None, job
            assert (event.worker_id, event.attempt) == (job.worker, job.attempts)
            assert event.by is None and event.reason
            assert job.error is not None and event.reason.startswith(job.error + "; "), (
                "the final reason keeps why the cancel was asked"
            )
            worker = self.workers[event.worker_id]
            assert (
                (context == "fail" and subject == job.id)
                or (context == "lose" and subject == worker.id)
                or (context == "tick" and self.silent(worker))
                or (context == "tick" and job.deadline is not None and job.deadline <= self.clock)
            ), (event, context, job)
            self._stop(job, event.worker_id, alive=False)
        job.status = "cancelled"
        if event.reason:
            job.error = event.reason
        job.updated_at = event.at

    def _absorb_expired(self, event: Expired, context: str, subject: str | None) -> None:
        # Any command that runs an assignment pass expires what is due first.
        job = self.jobs[event.job_id]
        assert job.status == "queued", job
        assert self.is_expired(job), f"{job.id} expired early: {job}"
        job.status = "expired"
        job.error = event.reason
        job.updated_at = event.at

    def _absorb_redriven(self, event: Redriven, context: str, subject: str | None) -> None:
        assert context == "redrive" and subject == event.job_id
        job = self.jobs[event.job_id]
        assert job.status == "dead"
        assert event.seq == self.next_seq
        self.next_seq += 1
        job.status = "queued"
        job.attempts = 0
        job.dead_reason = None
        job.error = None
        job.worker = None
        job.lease = None
        job.seq = event.seq
        job.updated_at = event.at
        job.expires_at = None
        job.not_before = None
        job.progress = None

    def _absorb_paused(self, event: Paused, context: str, subject: str | None) -> None:
        key = (event.scope.value, event.target)
        assert context == "pause" and subject == f"{key[0]}:{key[1]}"
        assert key not in self.pauses, f"{key} paused twice"
        assert (event.by, event.reason) == self.pause_request
        self.pauses[key] = event

    def _absorb_resumed(self, event: Resumed, context: str, subject: str | None) -> None:
        key = (event.scope.value, event.target)
        assert context == "unpause" and subject == f"{key[0]}:{key[1]}"
        assert key in self.pauses, f"{key} resumed while not paused"
        assert event.by == self.pause_request[0]
        del self.pauses[key]

    def _absorb_limit_set(self, event: LimitSet, context: str, subject: str | None) -> None:
        key = (event.scope.value, event.target)
        assert context == "set_limit" and subject == f"{key[0]}:{key[1]}"
        by, reason, knobs = self.limit_request
        assert (event.by, event.reason) == (by, reason)
        assert (event.max_inflight, event.rate, event.burst) == knobs, (event, knobs)
        old = self.limits.pop(key, None)
        assert old is None or (old.max_inflight, old.rate, old.burst) != knobs, "same limit"
        self.limits[key] = event
        self.limit_changed(*key)

    def _absorb_limit_removed(self, event: LimitRemoved, context: str, subject: str | None) -> None:
        key = (event.scope.value, event.target)
        assert context == "remove_limit" and subject == f"{key[0]}:{key[1]}"
        assert key in self.limits, f"{key} removed while not in force"
        assert event.by == self.limit_request[0]
        del self.limits[key]
        self.limit_changed(*key)

    def _absorb_worker_joined(self, event: WorkerJoined, context: str, subject: str | None) -> None:
        assert context == "join" and subject == event.worker_id
        worker = self.workers.get(event.worker_id)
        if worker is None:
            self.workers[event.worker_id] = MWorker(
                event.worker_id, event.subjects, event.at, event.owner
            )
        else:
            assert None in (worker.owner, event.owner) or worker.owner == event.owner, (
                f"{worker.id} of {worker.owner} joined by {event.owner}"
            )
            worker.subjects = event.subjects
            worker.last_seen = event.at
            if event.owner is not None:
                worker.owner = event.owner

    def _absorb_credit_granted(
        self, event: CreditGranted, context: str, subject: str | None
    ) -> None:
        assert context == "credit" and subject == event.worker_id
        worker = self.workers[event.worker_id]
        worker.credit = event.credits if event.replace else worker.credit + event.credits
        worker.last_seen = event.at

    def _absorb_worker_heartbeat(
        self, event: WorkerHeartbeat, context: str, subject: str | None
    ) -> None:
        assert context == "worker_heartbeat" and subject == event.worker_id
        self.workers[event.worker_id].last_seen = event.at

    def _absorb_worker_lost(self, event: WorkerLost, context: str, subject: str | None) -> None:
        worker = self.workers[event.worker_id]
        assert (context == "lose" and subject == worker.id) or (
            context == "tick" and self.silent(worker)
        )
        assert not worker.running, "worker lost before its jobs were requeued"
        del self.workers[event.worker_id]

    def _absorb_leader_elected(
        self, event: LeaderElected, context: str, subject: str | None
    ) -> None:
        raise AssertionError("the model folds elections itself")

    def _absorb_pruned(self, event: Pruned, context: str, subject: str | None) -> None:
        assert context == "prune"
        for job_id, job in list(self.jobs.items()):
            if (
                job.status in ("succeeded", "cancelled", "expired")
                and job.updated_at <= event.before
            ):
                del self.jobs[job_id]

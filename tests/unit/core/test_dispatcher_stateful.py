"""Random command sequences against the reference model, with invariants after every step.

Each rule sends one command to the core, checks the outcome the rules of docs/spec.md fix (a
rejection code, requeue versus dead-letter, deadlines, queue positions) and lets the reference
model check and fold every emitted event. After every step: the internal indexes agree with
the records, the model and the core agree job by job and worker by worker, attempts stay within
max_attempts, credits stay non-negative, no client exceeds its cap, a worker id stays bound
to the key that joined it (a join or settlement by another key is refused), replaying the emitted
events (through the JSON codec) on an empty dispatcher gives the same state, folding each
job's events with the per-job reducer gives the same record, and a dispatcher restored from
the records holds the same state. At the end, a worker that acks everything drains all jobs
to a terminal state.

Runtime is bounded by the settings below (400 examples: about 35 s on two shared cores); raise
CORE_STATEFUL_EXAMPLES to search longer.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from dispatch.core import (
    Cancelled,
    CancelRequested,
    Completed,
    CoreConfig,
    CreditGranted,
    DeadLettered,
    Dispatcher,
    Enqueued,
    Event,
    JobEvent,
    JobHeartbeat,
    JobRecord,
    JobStatus,
    LeaderElected,
    Limit,
    LimitRemoved,
    LimitSet,
    Paused,
    Pruned,
    Redriven,
    RejectCode,
    Rejected,
    Requeued,
    Resumed,
    RetryPolicy,
    SubmitRequest,
    WorkerHeartbeat,
    WorkerJoined,
    WorkerLost,
    WorkerRecord,
    check_invariants,
    decode_events,
    encode_events,
    fold_job_events,
    state_view,
)
from dispatch.core.checks import check_caps, check_work_conserving
from dispatch.core.client_commands import MAX_REASON_LENGTH
from dispatch.core.control_commands import MAX_PAUSE_REASON
from dispatch.core.leases import seeded_lease_tokens
from dispatch.core.progress import MAX_PROGRESS_MESSAGE
from tests.unit.core.reference_model import Model

CONFIG = CoreConfig(
    default_cap=2,
    caps={"c1": 1},
    ack_timeout_s=10.0,
    backoff_multiplier=2.0,
    max_ack_timeout_s=25.0,
    max_attempts=3,
    worker_expiry_s=30.0,
    # Failed and timed-out attempts wait (jittered, growing) before the next one, except
    # mail's, which retry at once (and so are reassigned at once when they time out).
    retry=RetryPolicy(delay_s=2.0, multiplier=2.0, max_delay_s=7.0, jitter=0.5),
    retry_by_exec=(("mail.*", RetryPolicy()),),
    # Crops have a hard time limit unless the job sets one; a cancelled running job's
    # worker has 4 s to stop (shorter than most deadlines, longer than some).
    max_run_by_exec=(("img.crop", 20.0),),
    cancel_grace_s=4.0,
    # Settings' limits: at most one job of each `acct:` key at once, and mail.send at most
    # one start every 2 s (bursts of 2); runtime limits replace them.
    limits={
        "key": {"acct:*": Limit(max_inflight=1)},
        "exec": {"mail.send": Limit(rate=0.5, burst=2)},
    },
)
# A job's own retry policy (some fields; the rest from its exec's).
RETRY_CHOICES = [None, None, {"delay_s": 1.0}, {"delay_s": 3.0, "jitter": 1.0}, {"delay_s": 0.0}]
JOB_IDS = [f"job-{n}" for n in range(10)]
CLIENTS = ["c1", "c2", "c3"]
EXECS = ["img.resize", "img.crop", "mail.send"]
WORKERS = ["w1", "w2", "w3"]
SUBJECT_SETS = [
    ("job.assign.img.*",),
    ("job.assign.>",),
    ("job.assign.mail.send", "job.assign.img.crop"),
    ("job.assign.img.>",),
    ("job.*.mail.*",),
]
# The API keys that join workers; None is an admin (no owner check).
OWNERS = ["k1", "k1", "k2", None]
# Which (attempt, lease) a settling rule presents: the job's own, or a wrong one.
LEASE_CHOICES = [
    "own",
    "own",
    "own",
    "attempt-1",
    "attempt+1",
    "bad-lease",
    "other-worker",
    "other-owner",
    "as-admin",
]
# A settling rule's job: any id, or (an index) one of the jobs assigned so far, so that the
# wrong-lease and wrong-owner choices meet jobs that have a lease.
SETTLE_TARGETS = st.one_of(st.sampled_from(JOB_IDS), st.integers(0, len(JOB_IDS) - 1))
# A job's own hard time limit per attempt (None: its exec's default).
MAX_RUN_CHOICES = [None, None, 5.0, 12.0]
# Who cancels (an API key's name, or None) and why; the last reason is too long.
CANCEL_BY = [None, "ops", "k1"]
CANCEL_REASONS = ["", "", "not needed", "x" * (MAX_REASON_LENGTH + 1)]
CANCEL_PATTERNS = [None, None, "img.*", "img.>", "mail.send", ">", "*.crop"]
# What a pause or unpause names: exec patterns (one, some or all of EXECS), clients (c9 never
# submits), and invalid ones (a bad scope, pattern or client id).
PAUSE_TARGETS = [
    ("exec", "img.*"),
    ("exec", "img.*"),
    ("exec", "mail.>"),
    ("exec", "img.resize"),
    ("exec", ">"),
    ("client", "c1"),
    ("client", "c2"),
    ("client", "c2"),
    ("client", "c9"),
    ("exec", "img..x"),
    ("exec", "img.>.x"),
    ("queue", "img.*"),
    ("client", ""),
]
PAUSE_REASONS = ["", "", "deploy", "x" * (MAX_PAUSE_REASON + 1)]
# A heartbeat's progress report, its normalised form (None: none sent), and whether it is
# refused; the last ones are invalid.
PROGRESS_CHOICES: list[tuple[Any, dict[str, Any] | None, bool]] = [
    (None, None, False),
    (None, None, False),
    ({"done": 1}, {"done": 1.0, "total": None, "message": None}, False),
    (
        {"done": 2.5, "total": 5, "message": "half"},
        {"done": 2.5, "total": 5.0, "message": "half"},
        False,
    ),
    (
        {"done": 0, "total": None, "message": None},
        {"done": 0.0, "total": None, "message": None},
        False,
    ),
    ({"done": -1}, None, True),
    ({"done": 1, "message": "m" * (MAX_PROGRESS_MESSAGE + 1)}, None, True),
    ({"done": 1, "eta": 3}, None, True),
    (["done", 1], None, True),
]
# What a limit names (the last ones are invalid), and its knobs: (max_inflight, rate, burst),
# the knobs the event carries, and whether they are refused.
KEYS = [None, None, None, "acct:1", "acct:2", "acct:1", "vip"]
LIMIT_TARGETS = [
    ("client", "c2"),
    ("client", "c3"),
    ("client", "c9"),
    ("exec", "img.*"),
    ("exec", "mail.send"),
    ("exec", ">"),
    ("key", "acct:1"),
    ("key", "acct:*"),
    ("key", "*"),
    ("key", "vip"),
    ("key", "a*b"),
    ("exec", "img..x"),
    ("zone", "x"),
]
Knobs = tuple[int | None, float | None, int | None]
LIMIT_KNOBS: list[tuple[tuple[Any, Any, Any], Knobs | None]] = [
    ((1, None, None), (1, None, None)),
    ((2, None, None), (2, None, None)),
    ((None, 0.5, None), (None, 0.5, 1)),
    ((None, 0.25, 2), (None, 0.25, 2)),
    ((1, 0.2, 1), (1, 0.2, 1)),
    ((0, None, None), None),
    ((None, 0, None), None),
    ((None, None, None), None),
    ((None, None, 3), None),
]
CANCEL_STATUSES = [
    frozenset({JobStatus.QUEUED, JobStatus.RUNNING}),
    frozenset({JobStatus.QUEUED}),
    frozenset({JobStatus.RUNNING}),
]


class DispatcherMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = Dispatcher(CONFIG, lease_token=seeded_lease_tokens(0))
        self.model = Model(CONFIG)
        self.replica = Dispatcher(CONFIG)
        self.job_events: dict[str, list[Event]] = defaultdict(list)
        self.now = 1000.0
        self.model.clock = self.now

    @initialize(owner=st.sampled_from(OWNERS), credits=st.integers(0, 3))
    def first_worker(self, owner: str | None, credits: int) -> None:
        """Most runs start with a worker (of a key, or an admin's), so that jobs get leases
        early and the settling rules meet running jobs, right and wrong keys included."""
        self.join("w1", ("job.assign.>",), owner)
        if credits:
            self.grant_credit("w1", credits, False)

    # --- plumbing -------------------------------------------------------------------------

    def record(self, events: list[Event], context: str, subject: str | None) -> None:
        for event in events:
            self.model.absorb(event, context, subject)
        decoded = decode_events(encode_events(events))
        assert decoded == events
        for event in decoded:
            assert self.replica.apply(event)
            if isinstance(event, JobEvent):
                self.job_events[event.job_id].append(event)
        self.model.check_work_conserving()
        check_work_conserving(self.core)

    def run(self, context: str, subject: str | None, call: Any) -> list[Event] | Rejected:
        try:
            events: list[Event] = call()
        except Rejected as rejection:
            return rejection
        self.record(events, context, subject)
        return events

    def target_job(self, pick: str | int) -> str:
        if isinstance(pick, str):
            return pick
        leased = sorted(job.id for job in self.model.jobs.values() if job.lease is not None)
        return leased[pick % len(leased)] if leased else JOB_IDS[pick]

    def settle_args(self, job_id: str, choice: str) -> tuple[int, str, str | None, str | None]:
        """(attempt, lease, worker_id, owner) for a settling command."""
        job = self.model.jobs.get(job_id)
        if job is None or job.lease is None:
            return 1, "0.999", None, None
        holder = self.model.workers.get(job.worker or "")
        owner = None if holder is None else holder.owner
        if choice == "attempt-1":
            return max(1, job.attempts - 1), job.lease, None, owner
        if choice == "attempt+1":
            return job.attempts + 1, job.lease, None, owner
        if choice == "bad-lease":
            return job.attempts, job.lease + "x", None, owner
        if choice == "other-worker":
            return job.attempts, job.lease, "w-other", owner
        if choice == "other-owner":
            return job.attempts, job.lease, job.worker, "k-intruder"
        if choice == "as-admin":
            return job.attempts, job.lease, None, None
        return job.attempts, job.lease, job.worker, owner

    def expect_settlement(
        self, job_id: str, attempt: int, lease: str, worker_id: str | None, owner: str | None
    ) -> str | RejectCode:
        """'current' when (attempt, lease, worker, owner) holds the running job, 'ended' when
        they name its last attempt, which has ended; else the rejection code."""
        job = self.model.jobs.get(job_id)
        if job is None:
            return RejectCode.NOT_FOUND
        same = (attempt, lease) == (job.attempts, job.lease)
        holder = self.model.workers.get(job.worker or "")
        foreign = (
            owner is not None
            and holder is not None
            and holder.owner is not None
            and holder.owner != owner
        )
        if same and worker_id in (None, job.worker) and not foreign:
            return "current" if job.status == "running" else "ended"
        return RejectCode.STALE_LEASE

    @staticmethod
    def check_refusal(
        result: list[Event] | Rejected, expected: str | RejectCode, owner: str | None
    ) -> None:
        assert isinstance(result, Rejected) and result.code is expected, result
        if owner is not None:
            assert "held by" not in result.detail, "a worker key must not learn who holds a job"

    # --- clients --------------------------------------------------------------------------

    @rule(
        job_id=st.sampled_from(JOB_IDS),
        client=st.sampled_from(CLIENTS),
        exec_name=st.sampled_from(EXECS),
        priority=st.sampled_from([0, 0, 1]),
        delay=st.sampled_from([0.0, 0.0, 0.0, 5.0]),
        max_attempts=st.sampled_from([None, 1, 2, 3]),
        timeout=st.sampled_from([None, None, 4.0]),
        retry=st.sampled_from(RETRY_CHOICES),
        ttl=st.sampled_from([None, None, 0.0, 2.0, 8.0]),
        max_run=st.sampled_from(MAX_RUN_CHOICES),
        key=st.sampled_from(KEYS),
    )
    def submit(
        self,
        job_id: str,
        client: str,
        exec_name: str,
        priority: int,
        delay: float,
        max_attempts: int | None,
        timeout: float | None,
        retry: dict[str, float] | None,
        ttl: float | None,
        max_run: float | None,
        key: str | None,
    ) -> None:
        # ttl 0: an absolute expiry already passed (a record read late); the others: ttl_s.
        expires_at = self.now - 1.0 if ttl == 0.0 else None
        request = SubmitRequest(
            id=job_id,
            exec=exec_name,
            payload={"job": job_id},
            client_id=client,
            max_attempts=max_attempts,
            timeout_s=timeout,
            priority=priority,
            delay_s=delay,
            retry=retry,
            ttl_s=ttl or None,
            expires_at=expires_at,
            max_run_s=max_run,
            key=key,
        )
        known = job_id in self.model.jobs
        before = self.core.job(job_id)
        events = self.run("submit", job_id, lambda: self.core.submit(request, self.now))
        assert isinstance(events, list)
        if known:
            assert events == [] and self.core.job(job_id) == before
            return
        first = events[0]
        assert isinstance(first, Enqueued)
        assert (first.client_id, first.exec, first.priority) == (client, exec_name, priority)
        assert first.max_attempts == (max_attempts or CONFIG.max_attempts)
        assert first.timeout_s == (timeout or CONFIG.ack_timeout_s)
        assert first.not_before == (self.now + delay if delay else None)
        assert first.expires_at == (self.now + ttl if ttl else expires_at)
        assert first.max_run_s == (max_run or self.model.max_run_for_exec(exec_name))
        assert first.key == key
        if retry is None:
            assert first.retry is None
        else:
            assert first.retry == self.model.policy_for_exec(exec_name).merged(retry)

    @rule(
        job_ids=st.lists(st.sampled_from(JOB_IDS), min_size=1, max_size=4),
        clients=st.lists(st.sampled_from(CLIENTS), min_size=4, max_size=4),
        exec_name=st.sampled_from(EXECS),
        key=st.sampled_from(KEYS),
    )
    def submit_batch(
        self, job_ids: list[str], clients: list[str], exec_name: str, key: str | None
    ) -> None:
        """Several jobs, one assignment pass: the pass must still pick workers by the rule
        (and, with a key, start no more of them than the key's limit allows)."""
        requests = [
            SubmitRequest(id=job_id, exec=exec_name, payload=n, client_id=clients[n], key=key)
            for n, job_id in enumerate(job_ids)
        ]
        fresh = list(dict.fromkeys(job_id for job_id in job_ids if job_id not in self.model.jobs))
        events = self.run("submit", None, lambda: self.core.submit_many(requests, self.now))
        assert isinstance(events, list)
        enqueued = [event for event in events if isinstance(event, Enqueued)]
        assert [event.job_id for event in enqueued] == fresh
        assert all(e.max_run_s == self.model.max_run_for_exec(exec_name) for e in enqueued)

    @rule(
        job_id=st.one_of(st.sampled_from([*JOB_IDS, "nope"]), st.integers(0, len(JOB_IDS) - 1)),
        by=st.sampled_from(CANCEL_BY),
        reason=st.sampled_from(CANCEL_REASONS),
    )
    def cancel(self, job_id: str | int, by: str | None, reason: str) -> None:
        """A queued job ends at once; a running one is asked to stop (once)."""
        job_id = self.target_job(job_id)
        job = self.model.jobs.get(job_id)
        status = None if job is None else job.status
        cancelling = job is not None and job.cancel_requested_at is not None
        self.model.cancel_by, self.model.cancel_reason = by, reason
        result = self.run(
            "cancel", job_id, lambda: self.core.cancel(job_id, self.now, by=by, reason=reason)
        )
        if status is None:
            assert isinstance(result, Rejected) and result.code is RejectCode.NOT_FOUND
        elif len(reason) > MAX_REASON_LENGTH:
            assert isinstance(result, Rejected) and result.code is RejectCode.INVALID
        elif status == "queued":
            assert isinstance(result, list) and [type(event) for event in result] == [Cancelled]
        elif status == "running":
            expected = [] if cancelling else [CancelRequested]
            assert isinstance(result, list) and [type(event) for event in result] == expected
        else:
            assert isinstance(result, Rejected) and result.code is RejectCode.NOT_CANCELLABLE

    @rule(
        exec_pattern=st.sampled_from(CANCEL_PATTERNS),
        client=st.sampled_from([None, None, *CLIENTS]),
        statuses=st.sampled_from(CANCEL_STATUSES),
        limit=st.sampled_from([1, 1, 2, 10_000]),
        by=st.sampled_from(CANCEL_BY),
        reason=st.sampled_from(CANCEL_REASONS),
    )
    def cancel_where(
        self,
        exec_pattern: str | None,
        client: str | None,
        statuses: frozenset[JobStatus],
        limit: int,
        by: str | None,
        reason: str,
    ) -> None:
        """Bulk cancel: the model predicts exactly which jobs, in which order."""
        chosen = self.model.cancel_candidates(
            exec_pattern, client, frozenset(status.value for status in statuses)
        )[:limit]
        expected = [
            (CancelRequested if job.status == "running" else Cancelled, job.id) for job in chosen
        ]
        self.model.cancel_by, self.model.cancel_reason = by, reason
        result = self.run(
            "cancel_where",
            None,
            lambda: self.core.cancel_where(
                self.now,
                exec_pattern=exec_pattern,
                client_id=client,
                statuses=statuses,
                limit=limit,
                by=by,
                reason=reason,
            ),
        )
        if len(reason) > MAX_REASON_LENGTH:
            assert isinstance(result, Rejected) and result.code is RejectCode.INVALID
            return
        assert isinstance(result, list)
        assert [(type(event), event.job_id) for event in result] == expected  # type: ignore[attr-defined]

    @rule(job_id=st.sampled_from([*JOB_IDS, "nope"]), by=st.sampled_from([None, "ops-key"]))
    def redrive(self, job_id: str, by: str | None) -> None:
        was = self.model.jobs.get(job_id)
        status = None if was is None else was.status
        result = self.run("redrive", job_id, lambda: self.core.redrive(job_id, self.now, by=by))
        if status is None:
            assert isinstance(result, Rejected) and result.code is RejectCode.NOT_FOUND
        elif status != "dead":
            assert isinstance(result, Rejected) and result.code is RejectCode.NOT_DEAD
        else:
            assert isinstance(result, list) and isinstance(result[0], Redriven)
            assert result[0].by == by, "the redrive records who asked"
            assert self.model.jobs[job_id].attempts in (0, 1)

    @rule(age=st.sampled_from([0.0, 5.0, 30.0, 1e9]), keep=st.sampled_from([None, 0, 1, 3]))
    def prune(self, age: float, keep: int | None) -> None:
        before = self.now - age
        finished = [
            job.updated_at
            for job in self.model.jobs.values()
            if job.status in ("succeeded", "cancelled", "expired")
        ]
        due = any(at <= before for at in finished) or (keep is not None and len(finished) > keep)
        events = self.run("prune", None, lambda: self.core.prune(before, self.now, keep))
        assert isinstance(events, list)
        assert [type(event) for event in events] == ([Pruned] if due else [])
        if keep is not None:
            # The bound holds: at most `keep` finished jobs stay (ties at the cut go too).
            left = sum(
                job.status in ("succeeded", "cancelled", "expired")
                for job in self.model.jobs.values()
            )
            assert left <= keep

    # --- workers --------------------------------------------------------------------------

    @rule(
        worker=st.sampled_from(WORKERS),
        subjects=st.sampled_from(SUBJECT_SETS),
        owner=st.sampled_from(OWNERS),
    )
    def join(self, worker: str, subjects: tuple[str, ...], owner: str | None) -> None:
        known = self.model.workers.get(worker)
        recorded = None if known is None else known.owner
        result = self.run(
            "join", worker, lambda: self.core.join(worker, list(subjects), self.now, owner=owner)
        )
        if None not in (owner, recorded) and owner != recorded:
            assert isinstance(result, Rejected) and result.code is RejectCode.FORBIDDEN
            assert self.core.worker_owner(worker) == recorded
            return
        assert isinstance(result, list)
        first = result[0]
        assert isinstance(first, WorkerJoined) and first.subjects == subjects
        assert self.core.worker_owner(worker) == (owner if owner is not None else recorded)

    @rule(worker=st.sampled_from(WORKERS), credits=st.integers(1, 3), replace=st.booleans())
    def grant_credit(self, worker: str, credits: int, replace: bool) -> None:
        known = worker in self.model.workers
        result = self.run(
            "credit",
            worker,
            lambda: self.core.grant_credit(worker, credits, self.now, replace=replace),
        )
        if not known:
            assert isinstance(result, Rejected) and result.code is RejectCode.UNKNOWN_WORKER
        else:
            assert isinstance(result, list) and isinstance(result[0], CreditGranted)

    @rule(worker=st.sampled_from(WORKERS))
    def worker_heartbeat(self, worker: str) -> None:
        known = worker in self.model.workers
        result = self.run(
            "worker_heartbeat", worker, lambda: self.core.worker_heartbeat(worker, self.now)
        )
        if not known:
            assert isinstance(result, Rejected) and result.code is RejectCode.UNKNOWN_WORKER
        else:
            assert isinstance(result, list) and [type(e) for e in result] == [WorkerHeartbeat]

    @rule(worker=st.sampled_from(WORKERS))
    def lose_worker(self, worker: str) -> None:
        known = worker in self.model.workers
        holding = set(self.model.workers[worker].running) if known else set()
        result = self.run("lose", worker, lambda: self.core.lose_worker(worker, self.now))
        if not known:
            assert isinstance(result, Rejected) and result.code is RejectCode.UNKNOWN_WORKER
            return
        assert isinstance(result, list)
        settled = [e.job_id for e in result if isinstance(e, Requeued | DeadLettered | Cancelled)]
        assert set(settled) == holding, "every job of the lost worker is requeued at once"
        assert isinstance(result[len(settled)], WorkerLost)
        assert worker not in self.model.workers and self.core.worker(worker) is None

    # --- settling -------------------------------------------------------------------------

    @rule(pick=SETTLE_TARGETS, choice=st.sampled_from(LEASE_CHOICES))
    def ack(self, pick: str | int, choice: str) -> None:
        job_id = self.target_job(pick)
        attempt, lease, worker_id, owner = self.settle_args(job_id, choice)
        expected = self.expect_settlement(job_id, attempt, lease, worker_id, owner)
        job = self.model.jobs.get(job_id)
        result = self.run(
            "ack",
            job_id,
            lambda: self.core.ack(
                job_id,
                attempt,
                lease,
                self.now,
                result={"ok": job_id},
                worker_id=worker_id,
                owner=owner,
            ),
        )
        if expected == "current":
            assert isinstance(result, list) and isinstance(result[0], Completed)
            assert self.core.job(job_id).result == {"ok": job_id}  # type: ignore[union-attr]
        elif expected == "ended":
            assert job is not None
            if job.status == "succeeded":
                assert result == [], "a repeated ack answers the first outcome"
            else:
                assert isinstance(result, Rejected) and result.code is RejectCode.ALREADY_SETTLED
        else:
            self.check_refusal(result, expected, owner)

    @rule(
        pick=SETTLE_TARGETS,
        choice=st.sampled_from(LEASE_CHOICES),
        retryable=st.booleans(),
        retry_after=st.sampled_from([None, None, 0.0, 4.0]),
    )
    def fail(
        self, pick: str | int, choice: str, retryable: bool, retry_after: float | None
    ) -> None:
        job_id = self.target_job(pick)
        attempt, lease, worker_id, owner = self.settle_args(job_id, choice)
        expected = self.expect_settlement(job_id, attempt, lease, worker_id, owner)
        job = self.model.jobs.get(job_id)
        last_attempt = job is not None and job.attempts >= job.max_attempts
        cancelling = job is not None and job.cancel_requested_at is not None
        self.model.retry_after = retry_after
        result = self.run(
            "fail",
            job_id,
            lambda: self.core.fail(
                job_id,
                attempt,
                lease,
                self.now,
                error=f"boom {job_id}",
                retryable=retryable,
                worker_id=worker_id,
                owner=owner,
                retry_after_s=retry_after,
            ),
        )
        self.model.retry_after = None
        if expected == "current":
            assert isinstance(result, list)
            first = result[0]
            if cancelling:
                # The worker stopped, as asked: cancelled, whatever the failure.
                assert isinstance(first, Cancelled) and first.worker_id is not None
                assert f"boom {job_id}" in first.reason
                assert self.model.jobs[job_id].error == first.reason
                return
            if not retryable:
                assert isinstance(first, DeadLettered)
                assert first.reason.value == "permanent_failure"
            elif last_attempt:
                assert isinstance(first, DeadLettered)
                assert first.reason.value == "retries_exhausted"
            else:
                assert isinstance(first, Requeued) and first.reason.value == "failed"
                if retry_after:
                    assert first.not_before == self.now + retry_after
            error = self.model.jobs[job_id].error
            assert error == f"boom {job_id}" or self.model.jobs[job_id].status == "expired"
        elif expected == "ended":
            assert job is not None
            if job.status == "dead" and job.dead_reason in (
                "permanent_failure",
                "retries_exhausted",
            ):
                assert result == []
            else:
                assert isinstance(result, Rejected) and result.code is RejectCode.ALREADY_SETTLED
        else:
            self.check_refusal(result, expected, owner)

    @rule(
        pick=SETTLE_TARGETS,
        choice=st.sampled_from(LEASE_CHOICES),
        progress=st.sampled_from(PROGRESS_CHOICES),
    )
    def heartbeat(
        self, pick: str | int, choice: str, progress: tuple[Any, dict[str, Any] | None, bool]
    ) -> None:
        sent, normalised, invalid = progress
        job_id = self.target_job(pick)
        attempt, lease, worker_id, owner = self.settle_args(job_id, choice)
        expected = self.expect_settlement(job_id, attempt, lease, worker_id, owner)
        self.model.progress_sent = normalised
        result = self.run(
            "heartbeat",
            job_id,
            lambda: self.core.heartbeat(
                job_id,
                attempt,
                lease,
                self.now,
                worker_id=worker_id,
                owner=owner,
                progress=sent,
            ),
        )
        self.model.progress_sent = None
        if invalid:
            # The report is checked first: refused whoever sends it, naming the field.
            assert isinstance(result, Rejected) and result.code is RejectCode.INVALID, result
            assert result.detail.startswith("progress"), result.detail
        elif expected == "current":
            assert isinstance(result, list) and [type(e) for e in result] == [JobHeartbeat]
        elif expected == "ended":
            assert isinstance(result, Rejected) and result.code is RejectCode.ALREADY_SETTLED
        else:
            self.check_refusal(result, expected, owner)

    # --- operator controls ----------------------------------------------------------------

    @staticmethod
    def pause_is_valid(scope: str, target: str) -> bool:
        if scope == "client":
            return bool(target)
        return scope == "exec" and ".." not in target and ">." not in target

    @rule(
        what=st.sampled_from(PAUSE_TARGETS),
        by=st.sampled_from(CANCEL_BY),
        reason=st.sampled_from(PAUSE_REASONS),
    )
    def pause(self, what: tuple[str, str], by: str | None, reason: str) -> None:
        scope, target = what
        was_paused = what in self.model.pauses
        self.model.pause_request = (by, reason)
        result = self.run(
            "pause",
            f"{scope}:{target}",
            lambda: self.core.pause(scope, target, self.now, by=by, reason=reason),
        )
        if not self.pause_is_valid(scope, target) or len(reason) > MAX_PAUSE_REASON:
            assert isinstance(result, Rejected) and result.code is RejectCode.INVALID, result
            return
        assert isinstance(result, list)
        # A second pause answers nothing (the first one's key and reason stay).
        assert [type(e) for e in result] == ([] if was_paused else [Paused])
        assert what in self.model.pauses

    @precondition(lambda self: any(j.status == "running" for j in self.model.jobs.values()))
    @rule(pick=st.integers(0, len(JOB_IDS) - 1), by_client=st.booleans())
    def pause_a_running_job(self, pick: int, by_client: bool) -> None:
        """Pause the exec or the client of a running job, so that its timeout (a tick
        later) meets the pause: requeued, never reassigned."""
        running = sorted(j.id for j in self.model.jobs.values() if j.status == "running")
        job = self.model.jobs[running[pick % len(running)]]
        self.pause(("client", job.client) if by_client else ("exec", job.exec), "ops", "")

    @precondition(lambda self: bool(self.model.pauses))
    @rule(pick=st.integers(0, 5))
    def unpause_one_in_force(self, pick: int) -> None:
        paused = list(self.model.pauses)
        self.unpause(paused[pick % len(paused)], None)

    @rule(what=st.sampled_from(PAUSE_TARGETS), by=st.sampled_from(CANCEL_BY))
    def unpause(self, what: tuple[str, str], by: str | None) -> None:
        scope, target = what
        was_paused = what in self.model.pauses
        self.model.pause_request = (by, "")
        result = self.run(
            "unpause",
            f"{scope}:{target}",
            lambda: self.core.unpause(scope, target, self.now, by=by),
        )
        if not self.pause_is_valid(scope, target):
            assert isinstance(result, Rejected) and result.code is RejectCode.INVALID, result
            return
        assert isinstance(result, list)
        if not was_paused:
            assert result == []
        else:
            assert isinstance(result[0], Resumed) and what not in self.model.pauses
            # Whatever it held and can start now, starts (checked by the model: the pass
            # is work-conserving for what is not paused).

    @rule(
        what=st.sampled_from(LIMIT_TARGETS),
        knobs=st.sampled_from(LIMIT_KNOBS),
        by=st.sampled_from(CANCEL_BY),
        reason=st.sampled_from(["", "noisy"]),
    )
    def set_limit(
        self,
        what: tuple[str, str],
        knobs: tuple[tuple[Any, Any, Any], Knobs | None],
        by: str | None,
        reason: str,
    ) -> None:
        scope, target = what
        (max_inflight, rate, burst), expected = knobs
        before = self.model.limits.get(what)
        self.model.limit_request = (by, reason, expected)
        result = self.run(
            "set_limit",
            f"{scope}:{target}",
            lambda: self.core.set_limit(
                scope, target, self.now, max_inflight=max_inflight, rate=rate, burst=burst,
                by=by, reason=reason,
            ),
        )  # fmt: skip
        if what in LIMIT_TARGETS[-3:] or expected is None:
            assert isinstance(result, Rejected) and result.code is RejectCode.INVALID, result
            return
        assert isinstance(result, list)
        same = before is not None and (before.max_inflight, before.rate, before.burst) == expected
        assert [type(e) for e in result[:1]] == ([] if same else [LimitSet])
        assert what in self.model.limits

    @precondition(lambda self: bool(self.model.limits))
    @rule(pick=st.integers(0, 5))
    def remove_one_limit_in_force(self, pick: int) -> None:
        in_force = list(self.model.limits)
        self.remove_limit(in_force[pick % len(in_force)], "ops")

    @rule(what=st.sampled_from(LIMIT_TARGETS), by=st.sampled_from(CANCEL_BY))
    def remove_limit(self, what: tuple[str, str], by: str | None) -> None:
        scope, target = what
        was_set = what in self.model.limits
        self.model.limit_request = (by, "", None)
        result = self.run(
            "remove_limit",
            f"{scope}:{target}",
            lambda: self.core.remove_limit(scope, target, self.now, by=by),
        )
        if what in LIMIT_TARGETS[-3:]:
            assert isinstance(result, Rejected) and result.code is RejectCode.INVALID, result
            return
        assert isinstance(result, list)
        assert [type(e) for e in result[:1]] == ([LimitRemoved] if was_set else [])
        assert what not in self.model.limits

    # --- time and leadership --------------------------------------------------------------

    @rule(dt=st.sampled_from([0.5, 3.0, 6.0, 11.0, 26.0, 31.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.model.clock = self.now
        events = self.run("tick", None, lambda: self.core.tick(self.now))
        assert isinstance(events, list)
        self.model.check_timers_done()

    @precondition(lambda self: any(j.status == "running" for j in self.model.jobs.values()))
    @rule(pick=st.integers(0, len(JOB_IDS) - 1))
    def tick_to_a_deadline(self, pick: int) -> None:
        """Tick exactly to a running job's deadline: timeouts (reassigned, requeued when
        paused or delayed, time limits, cancels' graces) are met far more often."""
        running = sorted(j.id for j in self.model.jobs.values() if j.status == "running")
        deadline = self.model.jobs[running[pick % len(running)]].deadline
        assert deadline is not None and deadline > self.now
        self.tick(deadline - self.now)

    @precondition(lambda self: self.model.epoch < 3)
    @rule()
    def elect(self) -> None:
        old = self.model.epoch
        try:
            self.core.begin_epoch(old, self.now)
        except Rejected as rejection:
            assert rejection.code is RejectCode.STALE_EPOCH
        else:
            raise AssertionError("an epoch that is not newer must be refused")
        events = self.core.begin_epoch(old + 1, self.now)
        assert events == [LeaderElected(epoch=old + 1, at=self.now)]
        self.model.epoch = old + 1
        assert self.replica.apply(events[0])
        # A deposed leader's event after the election is void on replay.
        zombie = WorkerHeartbeat(epoch=old, at=self.now, worker_id="zombie")
        assert not self.replica.apply(zombie)

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def indexes_agree_with_records(self) -> None:
        check_invariants(self.core)
        if not self.model.limits:
            # A lowered limit lets what runs go on above it (nothing new starts: the model
            # checks every start).
            check_caps(self.core)

    @invariant()
    def core_agrees_with_model(self) -> None:
        model = self.model
        assert {job.id for job in self.core.jobs()} == set(model.jobs)
        for job in self.core.jobs():
            mine = model.jobs[job.id]
            assert job.status.value == mine.status, (job, mine)
            assert job.attempts == mine.attempts <= job.max_attempts
            assert (job.worker_id, job.lease, job.deadline) == (
                mine.worker,
                mine.lease,
                mine.deadline,
            )
            assert (job.result, job.error, job.seq) == (mine.result, mine.error, mine.seq)
            assert (job.not_before, job.expires_at, job.retry) == (
                mine.not_before,
                mine.expires_at,
                mine.retry,
            )
            dead_reason = None if job.dead_reason is None else job.dead_reason.value
            assert dead_reason == mine.dead_reason
            assert (job.max_run_s, job.run_limit_at, job.cancel_requested_at) == (
                mine.max_run_s,
                mine.run_limit_at,
                mine.cancel_requested_at,
            )
            assert job.submitted_at == mine.submitted_at
            assert job.progress == mine.progress, (job.progress, mine.progress)
        workers = {record.worker_id: record for record in self.core.workers()}
        assert set(workers) == set(model.workers)
        for worker_id, record in workers.items():
            mine_worker = model.workers[worker_id]
            assert record.credit == mine_worker.credit >= 0
            assert set(record.running) == set(mine_worker.running)
            assert record.subjects == mine_worker.subjects
            assert record.last_seen == mine_worker.last_seen
            assert record.owner == mine_worker.owner

    @invariant()
    def pauses_agree_with_model(self) -> None:
        assert [(p.scope.value, p.target) for p in self.core.pauses()] == list(self.model.pauses)
        assert self.core.pauses() == list(self.model.pauses.values())

    @invariant()
    def limits_agree_with_model(self) -> None:
        assert self.core.limits() == list(self.model.limits.values())
        for view in self.core.limit_views():
            knobs = self.model.knobs(view["scope"], view["target"])
            assert knobs == (view["max_inflight"], view["rate"], view["burst"]), view

    @invariant()
    def replay_gives_the_same_state(self) -> None:
        check_invariants(self.replica)
        assert state_view(self.replica) == state_view(self.core)

    @invariant()
    def per_job_fold_gives_the_same_records(self) -> None:
        for job in self.core.jobs():
            folded = fold_job_events(None, self.job_events[job.id])
            assert folded is not None and folded.to_dict() == job.to_dict()

    @invariant()
    def restore_gives_the_same_state(self) -> None:
        restored = Dispatcher.restore(
            [JobRecord.from_dict(job.to_dict()) for job in self.core.jobs()],
            config=CONFIG,
            workers=[WorkerRecord.from_dict(w.to_dict()) for w in self.core.workers()],
            epoch=self.core.epoch,
            pauses=self.core.pauses(),
            limits=self.core.limits(),
        )
        check_invariants(restored)
        mine, theirs = state_view(self.core), state_view(restored)
        for key in ("epoch", "jobs", "workers", "inflight", "pauses", "limits"):
            assert mine[key] == theirs[key], key
        # Jobs dead-lettered at the same instant may be listed in another order.
        assert sorted(mine["dead_letters"]) == sorted(theirs["dead_letters"])

    def teardown(self) -> None:
        """With the pauses ended and a live worker that acks, every job ends succeeded, dead,
        cancelled or expired."""
        for scope, target in list(self.model.pauses):
            self.unpause((scope, target), None)
        for scope, target in list(self.model.limits):
            self.remove_limit((scope, target), None)
        self.join("drain", ("job.>",), "k-drain")
        for _ in range(100):
            if all(job.is_terminal for job in self.core.jobs()):
                break
            self.grant_credit("drain", 3, False)
            for job_id, job in list(self.model.jobs.items()):
                if job.status == "running":
                    self.ack(job_id, "own")
            self.tick(6.0)
        assert all(job.is_terminal for job in self.core.jobs()), self.core.counts()


# A named profile, so a run can be tuned from one place; it is attached to this test only
# (not loaded globally), and CORE_STATEFUL_EXAMPLES raises the search for a longer hunt.
settings.register_profile(
    "core-stateful",
    max_examples=int(os.environ.get("CORE_STATEFUL_EXAMPLES", "400")),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDispatcherStateful = DispatcherMachine.TestCase
TestDispatcherStateful.settings = settings.get_profile("core-stateful")

"""The virtual-clock replay: the recorded submissions, fed to the pure core with another policy,
served by a simulated fleet.

A discrete-event simulation: the clock jumps from one instant to the next, whichever comes
first of the next outside event (a submission at its recorded time, a cancellation, an
operator's pause, resume or runtime limit, a worker joining or leaving, an attempt ending on
its worker, a worker stopping an attempt whose cancel reached it) and the core's next timer
(a deadline, a delayed job: `Dispatcher.next_timer_at`, where `tick` is called). Nothing
reads a real clock and nothing is drawn while it runs (the lease tokens are seeded, the
attempts' behaviour is fixed beforehand), so the same history, policy, fleet and seed give
the same events.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.errors import Rejected
from dispatch.core.events import Assigned, CancelRequested, Event, Reassigned
from dispatch.core.leases import seeded_lease_tokens
from dispatch.replay.behaviour import AttemptPlans
from dispatch.replay.fleet import FleetWorker
from dispatch.replay.model import ANSWERING, Outcome, RecordedControl, RecordedJob, RecordedLimit
from dispatch.replay.overrides import ReplayPolicy
from dispatch.settings import DispatcherSettings

ITERATION_SNAP_S = 0.05
"""A leader handles a passed deadline (or a delayed job come due) at its next iteration, not at
the instant itself. The recording's iterations are known where they logged something, so a
timer is fired at the first recorded instant at or after it, if one comes within this long (a
leader that is busy iterates every few milliseconds); else at the timer itself."""


class _Kind(IntEnum):
    # At one instant: workers join first and leave last, so a worker that joins when a
    # job arrives can take it; workers' answers and credit come before new jobs (a leader's
    # iteration takes its mailbox, then submissions), among themselves in recorded log order.
    JOIN = 0
    WORKER = 1
    SUBMIT = 2
    CANCEL = 3
    CONTROL = 4
    LEAVE = 5


@dataclass(frozen=True, slots=True)
class _Running:
    job_id: str
    attempt: int
    lease: str
    worker_id: str
    outcome: Outcome
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class _Heartbeat:
    running: _Running


@dataclass(frozen=True, slots=True)
class _Stop:
    """The worker stops `running` because its job's cancel reached it."""

    running: _Running


STOP_ERROR = "cancelled: cancel_requested"
"""The failure a worker answers when it stopped an attempt on a cancel (as the SDK does)."""


@dataclass(frozen=True, slots=True)
class _Freed:
    worker_id: str


@dataclass(frozen=True, slots=True)
class SimulationResult:
    events: tuple[Event, ...]
    """Every event the core decided, in order."""
    steps: int
    """Outside events processed plus ticks: the work the replay did."""


def submit_request(
    job: RecordedJob,
    policy: ReplayPolicy,
    recorded_under: DispatcherSettings,
    recorded_config: CoreConfig | None = None,
) -> SubmitRequest:
    """The job's submission under `policy`. A recorded `max_attempts`, `timeout_s` or
    `max_run_s` equal to the value of the settings it ran under (`recorded_under`; its
    `core_config()`, given as `recorded_config` when already made) is taken as that default,
    so a changed default applies to it; any other value was the job's own and is kept."""
    max_attempts: int | None = job.max_attempts
    if job.max_attempts == recorded_under.max_attempts:
        max_attempts = None
    timeout_s: float | None = job.timeout_s
    if job.timeout_s == recorded_under.ack_timeout_s:
        timeout_s = None
    max_run_s = job.max_run_s
    if max_run_s is not None:
        config = recorded_config if recorded_config is not None else recorded_under.core_config()
        if max_run_s == config.max_run_for(job.exec):
            max_run_s = None
    return SubmitRequest(
        id=job.job_id,
        exec=job.exec,
        payload=None,
        client_id=job.client_id,
        max_attempts=max_attempts,
        timeout_s=timeout_s,
        priority=policy.priority_of(job.exec, job.client_id, job.priority),
        not_before=job.not_before,
        retry=None if job.retry is None else job.retry.to_dict(),
        expires_at=job.expires_at,
        max_run_s=max_run_s,
        key=job.key,
    )


class Simulation:
    """One replay run; `run()` once."""

    def __init__(
        self,
        jobs: Sequence[RecordedJob],
        fleet: Sequence[FleetWorker],
        policy: ReplayPolicy,
        *,
        recorded_under: DispatcherSettings | None = None,
        seed: int = 0,
        iterations: Sequence[float] = (),
        controls: Sequence[RecordedControl | RecordedLimit] = (),
    ) -> None:
        self.iterations = iterations
        self.core = Dispatcher(policy.core_config(), lease_token=seeded_lease_tokens(seed))
        self.plans = AttemptPlans(jobs, seed)
        self.fleet = {worker.worker_id: worker for worker in fleet}
        self.alive: set[str] = set()
        self.jobs = {job.job_id: job for job in jobs}
        self._running: dict[str, _Running] = {}
        """The latest attempt of each job whose worker stopped it on a cancel in the
        recording (the attempt a replayed cancel has its worker stop)."""
        self._agenda: list[tuple[float, int, int, int, object]] = []
        self._order = itertools.count()
        self._events: list[Event] = []
        baseline = recorded_under if recorded_under is not None else policy.dispatcher
        baseline_config = baseline.core_config()
        start = min((job.submitted_at for job in jobs), default=0.0)
        for worker in fleet:
            self._schedule(
                worker.joins_at if worker.joins_at is not None else start, _Kind.JOIN, worker
            )
            if worker.leaves_at is not None:
                self._schedule(worker.leaves_at, _Kind.LEAVE, worker)
        for job in jobs:
            request = submit_request(job, policy, baseline, baseline_config)
            self._schedule(job.submitted_at, _Kind.SUBMIT, request)
            if job.cancelled_at is not None:
                self._schedule(job.cancelled_at, _Kind.CANCEL, job)
        # The operator's pauses and resumes at their times, but for the targets the policy
        # pauses for the whole replay (from before anything else) or never; likewise the
        # runtime limits set and removed, but for the targets whose limit the policy sets
        # (`--set dispatcher.limits...`: the settings' limit holds for the whole replay).
        for (scope, target), paused in sorted(policy.pauses.items()):
            if paused:
                self._schedule(
                    start - 1.0, _Kind.CONTROL, RecordedControl(start, True, scope, target)
                )
        for control in controls:
            if isinstance(control, RecordedLimit):
                if (control.scope, control.target) not in policy.limit_targets:
                    self._schedule(control.at, _Kind.CONTROL, control)
            elif (control.scope, control.target) not in policy.pauses:
                self._schedule(control.at, _Kind.CONTROL, control)

    def _schedule(self, at: float, kind: _Kind, item: object, order: int = 0) -> None:
        # Times to the microsecond: a run time added to a start time must land on the same
        # instant as a recorded event at that time, not a rounding error before or after it.
        at = round(at, 6)
        heapq.heappush(self._agenda, (at, int(kind), order, next(self._order), item))

    def run(self) -> SimulationResult:
        core = self.core
        agenda = self._agenda
        steps = 0
        while True:
            timer = core.next_timer_at()
            # At one instant, what arrives from outside comes first and the timers after,
            # as in a leader's iteration (commands, then `tick`).
            if timer is not None:
                timer = self._iteration_at(timer)
            if agenda and (timer is None or agenda[0][0] <= timer):
                at, kind, _, _, item = heapq.heappop(agenda)
                self._handle(at, _Kind(kind), item)
            elif timer is not None:
                self._record(core.tick(timer))
            else:
                break
            steps += 1
        return SimulationResult(tuple(self._events), steps)

    def _iteration_at(self, timer: float) -> float:
        """When the recorded leader would have fired `timer` (see ITERATION_SNAP_S)."""
        iterations = self.iterations
        index = bisect.bisect_left(iterations, timer)
        if index < len(iterations) and iterations[index] - timer <= ITERATION_SNAP_S:
            return iterations[index]
        return timer

    def _handle(self, at: float, kind: _Kind, item: object) -> None:
        core = self.core
        if kind is _Kind.SUBMIT:
            assert isinstance(item, SubmitRequest)
            self._record(core.submit(item, at))
        elif kind is _Kind.WORKER:
            if isinstance(item, _Running):
                self._settle(item, at)
            elif isinstance(item, _Stop):
                self._stop(item.running, at)
            elif isinstance(item, _Heartbeat):
                self._heartbeat(item.running, at)
            else:
                assert isinstance(item, _Freed)
                if item.worker_id in self.alive:
                    self._record(core.grant_credit(item.worker_id, 1, at))
        elif kind is _Kind.JOIN:
            assert isinstance(item, FleetWorker)
            self.alive.add(item.worker_id)
            self._record(core.join(item.worker_id, item.subjects, at))
            self._record(core.grant_credit(item.worker_id, item.slots, at))
        elif kind is _Kind.LEAVE:
            assert isinstance(item, FleetWorker)
            if item.worker_id in self.alive:
                self.alive.discard(item.worker_id)
                self._record(core.lose_worker(item.worker_id, at, reason="left"))
        elif kind is _Kind.CONTROL and isinstance(item, RecordedLimit):
            # A removal answers [] for no runtime limit in force (e.g. one set before the
            # read); a limit set loosening one starts what it held.
            if item.set:
                self._record(
                    core.set_limit(
                        item.scope,
                        item.target,
                        at,
                        max_inflight=item.max_inflight,
                        rate=item.rate,
                        burst=item.burst,
                        by=item.by,
                        reason=item.reason,
                    )
                )
            else:
                self._record(core.remove_limit(item.scope, item.target, at, by=item.by))
        elif kind is _Kind.CONTROL:
            assert isinstance(item, RecordedControl)
            # Answers [] for what is paused already / not paused (e.g. a resume of a pause
            # from before the read).
            if item.pause:
                self._record(
                    core.pause(item.scope, item.target, at, by=item.by, reason=item.reason)
                )
            else:
                self._record(core.unpause(item.scope, item.target, at, by=item.by))
        else:
            assert isinstance(item, RecordedJob)
            # Refused when the job has ended in the replay (it ran sooner than in the
            # recording): then there is nothing to cancel. A running job's worker is told to
            # stop (`cancel_requested`); see `_record` for its answer.
            with contextlib.suppress(Rejected):
                self._record(
                    core.cancel(item.job_id, at, by=item.cancel_by, reason=item.cancel_reason)
                )

    def _settle(self, running: _Running, at: float) -> None:
        """An attempt's answer reaches the core. One the core refuses (the attempt timed out
        meanwhile and was reassigned: a stale lease) changes nothing, as for a real worker;
        the slot comes back all the same (`_Freed`, scheduled with the assignment)."""
        if running.worker_id not in self.alive:
            return
        core = self.core
        try:
            if running.outcome is Outcome.COMPLETED:
                self._record(core.ack(running.job_id, running.attempt, running.lease, at))
            else:
                retryable = running.outcome is Outcome.FAILED
                self._record(
                    core.fail(
                        running.job_id,
                        running.attempt,
                        running.lease,
                        at,
                        error="as recorded",
                        retryable=retryable,
                        retry_after_s=running.retry_after_s,
                    )
                )
        except Rejected:
            # A stale or settled attempt: the core refuses the worker's answer, as the
            # leader did in the recording; nothing else to do.
            pass

    def _stop(self, running: _Running, at: float) -> None:
        """The worker stopped an attempt on its job's cancel: it answers with a failure
        (refused if the attempt ended meanwhile: no matter)."""
        if running.worker_id not in self.alive:
            return
        with contextlib.suppress(Rejected):
            self._record(
                self.core.fail(
                    running.job_id,
                    running.attempt,
                    running.lease,
                    at,
                    error=STOP_ERROR,
                    retryable=False,
                )
            )

    def _heartbeat(self, running: _Running, at: float) -> None:
        if running.worker_id not in self.alive:
            return
        # Refused once the attempt has ended or timed out: as for a real worker, no matter.
        with contextlib.suppress(Rejected):
            self._record(self.core.heartbeat(running.job_id, running.attempt, running.lease, at))

    def _record(self, events: list[Event]) -> None:
        self._events.extend(events)
        plans = self.plans
        for event in events:
            if isinstance(event, Assigned | Reassigned):
                attempt = plans.attempt(event.job_id, event.attempt)
                running = _Running(
                    event.job_id, event.attempt, event.lease, event.worker_id, attempt.outcome,
                    attempt.retry_after_s,
                )  # fmt: skip
                job = self.jobs.get(event.job_id)
                if job is not None and job.cancel_stop_s is not None:
                    self._running[event.job_id] = running
                for offset in attempt.heartbeats:
                    self._schedule(event.at + offset, _Kind.WORKER, _Heartbeat(running))
                if attempt.outcome in ANSWERING:
                    self._schedule(event.at + attempt.run_s, _Kind.WORKER, running, attempt.order)
                self._schedule(
                    event.at + attempt.held_s,
                    _Kind.WORKER,
                    _Freed(event.worker_id),
                    attempt.held_order,
                )
            elif isinstance(event, CancelRequested):
                self._cancel_reached(event)

    def _cancel_reached(self, event: CancelRequested) -> None:
        """A running job's cancel: its worker stops the attempt as long after it as the
        recording showed (`RecordedJob.cancel_stop_s`); one that did not stop in the
        recording runs on as planned (an ack still completes the job; else its grace ends
        it)."""
        job = self.jobs.get(event.job_id)
        running = self._running.get(event.job_id)
        if job is None or job.cancel_stop_s is None or running is None:
            return
        if running.attempt != event.attempt:
            return
        order = self.plans.attempt(event.job_id, event.attempt).order
        self._schedule(event.at + job.cancel_stop_s, _Kind.WORKER, _Stop(running), order)


def simulate(
    jobs: Sequence[RecordedJob],
    fleet: Sequence[FleetWorker],
    policy: ReplayPolicy,
    *,
    recorded_under: DispatcherSettings | None = None,
    seed: int = 0,
    iterations: Sequence[float] = (),
    controls: Sequence[RecordedControl | RecordedLimit] = (),
) -> SimulationResult:
    """Replay `jobs` under `policy` on `fleet` (see the module's doc); `iterations`: the
    recorded instants timers snap to (`History.instants`); `controls`: the recorded pauses
    and resumes, and runtime limits set and removed (`History.controls`)."""
    simulation = Simulation(
        jobs,
        fleet,
        policy,
        recorded_under=recorded_under,
        seed=seed,
        iterations=iterations,
        controls=controls,
    )
    return simulation.run()

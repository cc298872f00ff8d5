"""What a replay knows about a recorded window: its jobs, how each attempt behaved, its workers.

Plain frozen values, built from the recorded events (`dispatch.replay.history`) and read by the
simulation; nothing here depends on Delta, Kafka or the clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dispatch.core.events import Event
from dispatch.core.retry import RetryPolicy


class Outcome(StrEnum):
    """How an attempt ended on its worker, as the recording shows it."""

    COMPLETED = "completed"
    """The worker acked it."""
    FAILED = "failed"
    """The worker reported a retryable failure."""
    FAILED_PERMANENT = "failed_permanent"
    """The worker reported a permanent failure."""
    STALLED = "stalled"
    """The worker never settled it: it timed out, or its worker was lost (also while a cancel
    of it was pending: its grace passed, or its worker went, before the worker confirmed). In
    a replay such an attempt holds its worker's slot for as long as it did in the recording
    and never acks."""
    CANCELLED = "cancelled"
    """Its job's cancel reached it while it ran and its worker stopped it (answered with a
    failure, which ended the job `cancelled`). In a replay it never answers on its own: its
    worker answers `RecordedJob.cancel_stop_s` after the cancel, as it did."""
    TIME_LIMIT = "time_limit"
    """It ran until its hard time limit (`max_run_s`) ended it (`requeued` or `dead_lettered`
    with reason `time_limit`). In a replay it never answers on its own (like a stalled
    attempt): the limit ends it again, or, under a longer limit, its ack timeout."""


ANSWERING = frozenset({Outcome.COMPLETED, Outcome.FAILED, Outcome.FAILED_PERMANENT})
"""Outcomes of attempts whose worker answers on its own, `run_s` after their start."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One recorded attempt: when its worker answered, how, and when its slot came back."""

    run_s: float
    """From its start to its settlement (for a stalled attempt: to its timeout or loss)."""
    outcome: Outcome
    order: int = 0
    """Where its end was logged (the index of the settling event in the read): attempts that
    end at one instant in the replay settle in the order the leader took their answers."""
    slot_s: float | None = None
    """From its start to the credit its worker granted when it freed the slot (the worker
    sends that credit after its answer, sometimes an iteration of the leader later; a
    timed-out attempt holds its slot until its late answer). None: not seen; the slot comes
    back with the settlement (`held_s`)."""
    slot_order: int | None = None
    """Where that credit was logged."""
    heartbeats: tuple[float, ...] = ()
    """When its worker sent job heartbeats (seconds after its start): a long job's way of
    moving its deadline, replayed at the same offsets."""
    retry_after_s: float | None = None
    """A failed attempt's own retry delay, when its worker asked for one (None: the policy's,
    so a what-if of other retry settings changes it)."""

    @property
    def held_s(self) -> float:
        """How long the attempt held its worker's slot."""
        return self.run_s if self.slot_s is None else max(self.slot_s, self.run_s)

    @property
    def held_order(self) -> int:
        return self.order if self.slot_order is None else self.slot_order


@dataclass(frozen=True, slots=True)
class RecordedJob:
    """A job submitted in the window, as its `enqueued` event and its attempts recorded it."""

    job_id: str
    client_id: str
    exec: str
    submitted_at: float
    priority: int
    max_attempts: int
    timeout_s: float
    not_before: float | None
    attempts: tuple[Attempt, ...]
    """The attempts that ended within the read, in order (an attempt still running when the
    recording ends is left out: its outcome is unknown)."""
    cancelled_at: float | None = None
    """When a cancel was asked for: of a queued job (it ended `cancelled` then), or of a
    running one (`cancel_requested`: its worker was told to stop)."""
    retry: RetryPolicy | None = None
    """The job's own retry policy, as submitted (None: the replay policy's default)."""
    expires_at: float | None = None
    max_run_s: float | None = None
    """The hard time limit of its attempts, as enqueued (its own, or its exec's default then;
    None: none)."""
    cancel_by: str | None = None
    """Who asked for its cancel (`cancelled_at`), as recorded."""
    cancel_reason: str = ""
    cancel_stop_s: float | None = None
    """A cancel that reached it running: how long after the cancel its worker stopped the
    attempt (None: it did not: the attempt completed anyway, its grace passed or its worker
    was lost first, or it was not running)."""
    key: str | None = None
    """Its concurrency key, as submitted (None: none)."""


@dataclass(frozen=True, slots=True)
class RecordedWorker:
    """A worker seen in the window, with the capacity it showed."""

    worker_id: str
    subjects: tuple[str, ...]
    slots: int
    """The most jobs it held plus credit it had left at any instant (its concurrency)."""
    joined_at: float | None
    """When it joined within the read; None: it was there before the window."""
    left_at: float | None
    """When it was lost within the read; None: it stayed."""


@dataclass(frozen=True, slots=True)
class RecordedControl:
    """An operator's pause (`pause=True`) or resume of an exec pattern's queues or a client's
    jobs, as recorded (`paused`/`resumed`), replayed at its time."""

    at: float
    pause: bool
    scope: str
    """`exec` or `client`."""
    target: str
    by: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RecordedLimit:
    """An operator's runtime limit set (`set=True`: `limit_set`, with its knobs) or removed
    (`limit_removed`) on a client, an exec pattern or a concurrency key, as recorded,
    replayed at its time."""

    at: float
    set: bool
    scope: str
    """`client`, `exec` or `key`."""
    target: str
    max_inflight: int | None = None
    rate: float | None = None
    burst: int | None = None
    by: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class History:
    """A recorded window: the jobs submitted in it, the workers seen, and the recorded events of
    those jobs (the "actual" side of a comparison)."""

    since: float
    until: float
    jobs: tuple[RecordedJob, ...]
    """The jobs to replay, in submission (log) order: the window's and its warm-up's."""
    workers: tuple[RecordedWorker, ...]
    events: tuple[Event, ...]
    """The recorded job events of the window's jobs (`reported`), in log order."""
    reported: frozenset[str] = frozenset()
    """The ids of the jobs enqueued in the window: those the comparison counts."""
    instants: tuple[float, ...] = ()
    """Every distinct time an event was logged at, ascending: instants the recorded leader
    iterated at (see `dispatch.replay.simulation.ITERATION_SNAP_S`)."""
    controls: tuple[RecordedControl | RecordedLimit, ...] = ()
    """The pauses and resumes, and the runtime limits set and removed, of the read, in log
    order."""

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
    """The worker never settled it: it timed out, or its worker was lost. In a replay such an
    attempt holds its worker's slot for as long as it did in the recording and never acks."""


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
    retry: RetryPolicy | None = None
    """The job's own retry policy, as submitted (None: the replay policy's default)."""
    expires_at: float | None = None


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

"""Worker commands: join, credit, heartbeat, loss.

A worker id is bound to the API key (its name, the *owner*) that joined it: while the worker
is live, a join by another key is refused (`forbidden`), so a key cannot take over another's
worker, its subjects or its jobs. A lost worker is forgotten, owner included: its id is free.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatch.core import _validate as v
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import (
    CreditGranted,
    Event,
    WorkerHeartbeat,
    WorkerJoined,
)
from dispatch.core.scheduler import Scheduler
from dispatch.core.state import DispatcherState
from dispatch.core.subjects import validate_patterns

MAX_CREDITS = 1_000_000
"""Most credit one grant may carry (a guard against typos such as 10**12)."""


class WorkerCommands:
    """What a worker (or the API on its behalf) tells the dispatcher."""

    def __init__(self, state: DispatcherState, scheduler: Scheduler) -> None:
        self._state = state
        self._scheduler = scheduler

    def join(
        self, worker_id: str, subjects: Sequence[str], now: float, *, owner: str | None = None
    ) -> list[Event]:
        """Register a worker, or update a known one's subject patterns (its credit and running
        jobs are kept, so joining again is harmless).

        `owner` names the API key joining. A new worker records it; a known worker whose
        recorded owner is another key refuses the join (`forbidden`), and one with no known
        owner (a placeholder after a restore, an admin's join) takes it. `owner=None` (an
        admin) skips the check and keeps the recorded owner."""
        try:
            v.as_id(worker_id, "worker_id")
            patterns = validate_patterns(subjects)
            if owner is not None and (not isinstance(owner, str) or not owner):
                raise ValueError(f"owner: expected a non-empty string or None, got {owner!r}")
        except ValueError as error:
            raise Rejected(RejectCode.INVALID, str(error)) from None
        state = self._state
        known = state._workers.get(worker_id)
        if (
            owner is not None
            and known is not None
            and known.owner is not None
            and known.owner != owner
        ):
            raise Rejected(RejectCode.FORBIDDEN, f"worker {worker_id!r} belongs to another key")
        now = state.advance_to(now)
        out: list[Event] = []
        state.emit(
            WorkerJoined(
                epoch=state.fence.epoch, at=now, worker_id=worker_id, subjects=patterns, owner=owner
            ),
            out,
        )
        self._scheduler.assignment_pass(now, out)
        return out

    def grant_credit(
        self, worker_id: str, credits: int, now: float, *, replace: bool = False
    ) -> list[Event]:
        """The worker can take `credits` more jobs; with `replace`, exactly `credits` jobs
        (what a REST poller means by "I have room for N"). Assigning spends credit; acks do
        not return it."""
        self._scheduler.known_worker(worker_id)
        minimum = 0 if replace else 1
        if (
            isinstance(credits, bool)
            or not isinstance(credits, int)
            or not minimum <= credits <= MAX_CREDITS
        ):
            raise Rejected(
                RejectCode.INVALID,
                f"credits: expected an integer in [{minimum}, {MAX_CREDITS}], got {credits!r}",
            )
        state = self._state
        now = state.advance_to(now)
        out: list[Event] = []
        state.emit(
            CreditGranted(
                epoch=state.fence.epoch,
                at=now,
                worker_id=worker_id,
                credits=credits,
                replace=replace,
            ),
            out,
        )
        self._scheduler.assignment_pass(now, out)
        return out

    def worker_heartbeat(self, worker_id: str, now: float) -> list[Event]:
        """The worker is alive (resets its expiry)."""
        self._scheduler.known_worker(worker_id)
        state = self._state
        now = state.advance_to(now)
        out: list[Event] = []
        state.emit(WorkerHeartbeat(epoch=state.fence.epoch, at=now, worker_id=worker_id), out)
        return out

    def lose_worker(
        self, worker_id: str, now: float, *, reason: str = "disconnected"
    ) -> list[Event]:
        """The worker is gone: requeue every job it holds at once (a job on its last allowed
        attempt is dead-lettered instead), then forget the worker."""
        scheduler = self._scheduler
        worker = scheduler.known_worker(worker_id)
        now = self._state.advance_to(now)
        out: list[Event] = []
        scheduler.lose(worker, now, reason, out)
        scheduler.assignment_pass(now, out)
        return out

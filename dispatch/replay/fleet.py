"""The simulated worker fleet: who serves the replay, with how many slots, from when to when.

A simulated worker joins with its subjects, grants credit for all its slots, and grants one
credit back each time an attempt it runs ends (what the worker SDK does: a slot frees when
its handler returns, whether the ack was accepted or not). It never goes silent, so the
core's `worker_expiry_s` plays no part; a worker the recording saw lost leaves at that time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dispatch.core.subjects import assign_subject, validate_patterns
from dispatch.replay.model import History

DEFAULT_SUBJECTS = (assign_subject(">"),)
"""A `--workers N` fleet takes every exec unless told otherwise."""


@dataclass(frozen=True, slots=True)
class FleetWorker:
    worker_id: str
    subjects: tuple[str, ...]
    slots: int
    joins_at: float | None = None
    """None: present from the start of the replay."""
    leaves_at: float | None = None
    """None: stays to the end."""

    def __post_init__(self) -> None:
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1:
            raise ValueError(f"worker {self.worker_id!r}: slots must be an integer >= 1")
        object.__setattr__(self, "subjects", validate_patterns(self.subjects))


def recorded_fleet(history: History) -> tuple[FleetWorker, ...]:
    """The workers the recording saw, with the slots, subjects and lifetimes it showed."""
    return tuple(
        FleetWorker(
            worker_id=worker.worker_id,
            subjects=worker.subjects,
            slots=worker.slots,
            joins_at=worker.joined_at,
            leaves_at=worker.left_at,
        )
        for worker in history.workers
    )


def uniform_fleet(
    count: int, slots: int, subjects: Sequence[str] = DEFAULT_SUBJECTS
) -> tuple[FleetWorker, ...]:
    """`count` identical workers (`sim-1`...), present for the whole replay."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"workers: expected an integer >= 1, got {count!r}")
    width = len(str(count))
    return tuple(
        FleetWorker(f"sim-{number:0{width}d}", tuple(subjects), slots)
        for number in range(1, count + 1)
    )


def typical_slots(history: History) -> int:
    """The median slots of the recorded workers (1 when none was seen): what a `--workers N`
    fleet gets per worker unless `--slots` says otherwise."""
    slots = sorted(worker.slots for worker in history.workers)
    return slots[len(slots) // 2] if slots else 1

"""How each simulated attempt behaves: taken from the job's recorded attempts, or, for a job
the recording never ran, from a recorded job of the same exec chosen by a seeded draw.

Attempt n of a job behaves as its recorded attempt n; past its recorded attempts (a shorter ack
timeout made the replay retry more), as its last recorded one: a job that completed keeps
completing, one that stalled keeps stalling.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from dispatch.replay.model import Attempt, Outcome, RecordedJob

INSTANT_SUCCESS = (Attempt(0.0, Outcome.COMPLETED),)
"""What a job runs like when nothing at all was recorded running (no attempt in the window)."""


class AttemptPlans:
    """Each job's attempts, fixed before the simulation starts (so the replay draws nothing
    while it runs, and the order of simulated events cannot change what is drawn)."""

    def __init__(self, jobs: Sequence[RecordedJob], seed: int) -> None:
        by_exec: dict[str, list[RecordedJob]] = {}
        for job in jobs:
            if job.attempts:
                by_exec.setdefault(job.exec, []).append(job)
        every = sorted((job for job in jobs if job.attempts), key=lambda job: job.job_id)
        for donors in by_exec.values():
            donors.sort(key=lambda job: job.job_id)
        self._plans: dict[str, tuple[Attempt, ...]] = {}
        for job in jobs:
            if job.attempts:
                self._plans[job.job_id] = job.attempts
                continue
            donors = by_exec.get(job.exec) or every
            if not donors:
                self._plans[job.job_id] = INSTANT_SUCCESS
                continue
            # A generator per job, seeded by the job: its draw does not depend on which
            # other jobs the window holds or in which order they come.
            draw = random.Random(f"{seed}:{job.job_id}")
            self._plans[job.job_id] = donors[draw.randrange(len(donors))].attempts

    def attempt(self, job_id: str, number: int) -> Attempt:
        """How attempt `number` (1-based) of `job_id` behaves."""
        plan = self._plans.get(job_id, INSTANT_SUCCESS)
        return plan[min(number, len(plan)) - 1]

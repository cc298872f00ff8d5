"""What a replay reports: per exec and per tenant (client_id), the recorded ("actual") figures
against the simulated ones, computed by the same function from either side's events.

- queue wait: per `assigned`, its time minus when the job last entered its queue (`enqueued`,
  `requeued`, `redriven`), or its `not_before` if later: the rule of the `stats` table;
- throughput: jobs completed per second, from the group's first submission to its last
  completion;
- attempts: attempts started (`assigned` + `reassigned`);
- dead-lettered: `dead_lettered` events.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field
from typing import Any

from dispatch.core.events import (
    Assigned,
    Completed,
    DeadLettered,
    Enqueued,
    Event,
    JobEvent,
    Reassigned,
    Redriven,
    Requeued,
)

ALL = "all"
EXEC = "exec"
CLIENT = "client"
DIMENSIONS = (ALL, EXEC, CLIENT)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of an ascending list."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    position = (len(sorted_values) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    weight = position - low
    return sorted_values[low] * (1 - weight) + sorted_values[high] * weight


@dataclass(frozen=True, slots=True)
class Figures:
    """One side (actual or simulated) of one group."""

    jobs: int
    completed: int
    dead_lettered: int
    attempts: int
    queue_wait_p50_s: float | None
    queue_wait_p95_s: float | None
    queue_wait_p99_s: float | None
    throughput_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _Tally:
    jobs: int = 0
    completed: int = 0
    dead_lettered: int = 0
    attempts: int = 0
    waits: list[float] = field(default_factory=list)
    first_submit: float = math.inf
    last_completion: float = -math.inf

    def figures(self) -> Figures:
        waits = sorted(self.waits)
        span = self.last_completion - self.first_submit
        return Figures(
            jobs=self.jobs,
            completed=self.completed,
            dead_lettered=self.dead_lettered,
            attempts=self.attempts,
            queue_wait_p50_s=_rounded(percentile(waits, 0.50)) if waits else None,
            queue_wait_p95_s=_rounded(percentile(waits, 0.95)) if waits else None,
            queue_wait_p99_s=_rounded(percentile(waits, 0.99)) if waits else None,
            throughput_per_s=_rounded(self.completed / span) if span > 0 else 0.0,
        )


def _rounded(value: float) -> float:
    # Microseconds: below what any event time means, and it keeps the JSON stable to read.
    return round(value, 6)


GroupKey = tuple[str, str]
"""(dimension, key): ("all", "all"), ("exec", "image.resize"), ("client", "acme")."""


def figures_by_group(
    events: Iterable[Event], only: AbstractSet[str] | None = None
) -> dict[GroupKey, Figures]:
    """The figures of every group the jobs of `events` (in log order) fall in; `only`: of
    those jobs only."""
    tallies: dict[GroupKey, _Tally] = {}
    groups_of: dict[str, tuple[_Tally, ...]] = {}
    entered: dict[str, float] = {}
    not_before: dict[str, float] = {}
    for event in events:
        if not isinstance(event, JobEvent):
            continue
        if isinstance(event, Enqueued):
            if only is not None and event.job_id not in only:
                continue
            keys = ((ALL, ALL), (EXEC, event.exec), (CLIENT, event.client_id))
            groups = tuple(tallies.setdefault(key, _Tally()) for key in keys)
            groups_of[event.job_id] = groups
            entered[event.job_id] = event.at
            if event.not_before is not None:
                not_before[event.job_id] = event.not_before
            for tally in groups:
                tally.jobs += 1
                tally.first_submit = min(tally.first_submit, event.at)
            continue
        groups = groups_of.get(event.job_id, ())
        if not groups:
            continue
        if isinstance(event, Assigned):
            since = max(entered[event.job_id], not_before.get(event.job_id, -math.inf))
            wait = max(0.0, event.at - since)
            for tally in groups:
                tally.attempts += 1
                tally.waits.append(wait)
        elif isinstance(event, Reassigned):
            for tally in groups:
                tally.attempts += 1
        elif isinstance(event, Requeued | Redriven):
            entered[event.job_id] = event.at
        elif isinstance(event, Completed):
            for tally in groups:
                tally.completed += 1
                tally.last_completion = max(tally.last_completion, event.at)
        elif isinstance(event, DeadLettered):
            for tally in groups:
                tally.dead_lettered += 1
    return {key: tally.figures() for key, tally in tallies.items()}


@dataclass(frozen=True, slots=True)
class Comparison:
    """One group, actual against simulated."""

    dimension: str
    key: str
    actual: Figures
    simulated: Figures

    def to_dict(self) -> dict[str, Any]:
        return {
            "dimension": self.dimension,
            "key": self.key,
            "actual": self.actual.to_dict(),
            "simulated": self.simulated.to_dict(),
        }


_EMPTY = Figures(0, 0, 0, 0, None, None, None, 0.0)


def compare(
    actual: Iterable[Event], simulated: Iterable[Event], only: AbstractSet[str] | None = None
) -> list[Comparison]:
    """Every group of either side, "all" first, then by exec, then by client, each by key;
    `only`: of those jobs only."""
    recorded = figures_by_group(actual, only)
    replayed = figures_by_group(simulated, only)
    keys = sorted(set(recorded) | set(replayed), key=lambda key: (DIMENSIONS.index(key[0]), key[1]))
    return [
        Comparison(
            dimension,
            key,
            recorded.get((dimension, key), _EMPTY),
            replayed.get((dimension, key), _EMPTY),
        )
        for dimension, key in keys
    ]


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """A replay's parameters and its comparison: what `--json` prints and `replays` stores.
    Nothing in it depends on when or where it ran, so the same replay gives the same report."""

    parameters: Mapping[str, Any]
    input_events: int
    simulated_events: int
    groups: tuple[Comparison, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "parameters": dict(self.parameters),
            "input_events": self.input_events,
            "simulated_events": self.simulated_events,
            "groups": [group.to_dict() for group in self.groups],
        }

"""The batch fold: a micro-batch of logged events + the touched jobs' rows -> new rows.

Pure Python, no Spark. It uses the dispatcher core's own semantics and nothing else:
- `EpochFence` per dispatcher group, seeded with the epoch persisted by the previous batch,
  decides which events count (the rule the leader applies on replay);
- `fold_job_events` folds each job's admitted events, in log order, starting from the job's
  current `jobs` row (`JobRecord.from_dict`), so Spark and the leader cannot disagree;
- `pruned{before}` events are applied at their place in the log, exactly as the core's
  `DispatcherState._on_pruned` does: a succeeded or cancelled job with `updated_at <= before`
  is forgotten by the leader, so it leaves `jobs` for `jobs_archive` (and the same id may start
  a new life later in the log).

An event that does not fit its job (the core's reducer refuses it) is refused: the job keeps
its state from before that event, the event is reported in `BatchFold.refused` (the batch
writes it to `rejected`) and the fold goes on with the job's next event. The fold never raises
on what the log holds: a record that stopped a batch would stop every replay of it too. (The
events it gets have values every column holds: `dispatch.streaming.decode.screen_events` sets the
others aside before the fence.)

Besides the core's `JobRecord`, each row keeps two timestamps the statistics need and the
record does not hold: `queued_at` (when the job last entered its queue) and `started_at` (when
its latest attempt started).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatch.core.errors import InvalidTransition
from dispatch.core.events import (
    Assigned,
    Cancelled,
    Completed,
    DeadLettered,
    Enqueued,
    JobEvent,
    Pruned,
    Reassigned,
    Redriven,
    Requeued,
)
from dispatch.core.fence import EpochFence
from dispatch.core.reducer import fold_job_events
from dispatch.delta.job_rows import (
    CLOSED_STATUSES,
    JobKey,
    JobState,
    job_row,
)
from dispatch.delta.stats import StatsAccumulator
from dispatch.streaming.decode import LoggedEvent, Refused

# --- the fence ---------------------------------------------------------------------------


def fence_batch(
    events: Sequence[LoggedEvent], epochs: Mapping[str, int]
) -> tuple[list[bool], dict[str, int]]:
    """Which events the per-group fence admits, and each group's fence epoch afterwards."""
    fences = {group: EpochFence(epoch) for group, epoch in epochs.items()}
    admitted: list[bool] = []
    for logged in events:
        fence = fences.get(logged.group)
        if fence is None:
            fence = fences[logged.group] = EpochFence()
        admitted.append(fence.admit(logged.event))
    return admitted, {group: fence.epoch for group, fence in fences.items()}


def touched_jobs(events: Sequence[LoggedEvent], admitted: Sequence[bool]) -> set[JobKey]:
    """The jobs whose admitted events are in the batch."""
    return {
        (logged.group, logged.event.job_id)
        for logged, ok in zip(events, admitted, strict=True)
        if ok and isinstance(logged.event, JobEvent)
    }


def prune_groups(events: Sequence[LoggedEvent], admitted: Sequence[bool]) -> set[str]:
    """The groups with an admitted `pruned` event in the batch."""
    return {
        logged.group
        for logged, ok in zip(events, admitted, strict=True)
        if ok and isinstance(logged.event, Pruned)
    }


# --- the fold ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PruneStep:
    """A `pruned` event, for the jobs the batch does not otherwise touch."""

    at: float
    before: float


@dataclass(frozen=True, slots=True)
class ArchivedLife:
    """A job life the leader forgot during the batch (it goes to `jobs_archive`)."""

    group: str
    state: JobState
    archived_at: float
    """The `at` of the `pruned` event."""


@dataclass
class BatchFold:
    """What one batch changes."""

    final: dict[JobKey, JobState | None] = field(default_factory=dict)
    """Each touched job's state after the batch (None: pruned and not submitted again)."""
    archived: list[ArchivedLife] = field(default_factory=list)
    """Lives of touched jobs pruned during the batch, in log order."""
    prunes: dict[str, list[PruneStep]] = field(default_factory=dict)
    """Per group, the batch's `pruned` events in log order (for the untouched jobs)."""
    stats: StatsAccumulator = field(default_factory=StatsAccumulator)
    refused: list[Refused] = field(default_factory=list)
    """Admitted job events the fold did not apply, and why (not counted in `stats`)."""


@dataclass(slots=True)
class _Life:
    """What the statistics track of the job life being folded."""

    exec: str
    client_id: str
    not_before: float | None
    queued_at: float | None
    started_at: float | None


def _life_of(state: JobState | None) -> _Life | None:
    if state is None:
        return None
    record = state.record
    return _Life(
        record.exec, record.client_id, record.not_before, state.queued_at, state.started_at
    )


def _observe(
    life: _Life | None, event: JobEvent, group: str, stats: StatsAccumulator | None
) -> _Life | None:
    """Track the life's timestamps through `event` and count it in `stats` (if given).

    Queue wait: an `assigned` event's time minus when the job entered its queue (or its
    `not_before`, if later: a delay is not waiting). Run time: a `completed` event's time minus
    its attempt's start. Retries: every attempt after the first (`assigned` with attempt > 1,
    and `reassigned`)."""
    at = event.at
    if isinstance(event, Enqueued):
        life = _Life(event.exec, event.client_id, event.not_before, at, None)
        if stats is not None:
            stats.count("submitted", at, group, life.exec, life.client_id)
        return life
    if life is None:
        # The fold raises for this event; nothing to count.
        return None
    exec_name, client_id = life.exec, life.client_id
    if isinstance(event, Assigned | Reassigned):
        if stats is not None:
            stats.count("started", at, group, exec_name, client_id)
            if event.attempt > 1:
                stats.count("retries", at, group, exec_name, client_id)
            if isinstance(event, Assigned) and life.queued_at is not None:
                ready = life.queued_at
                if life.not_before is not None and life.not_before > ready:
                    ready = life.not_before
                stats.queue_wait(at - ready, at, group, exec_name, client_id)
        life.started_at = at
    elif isinstance(event, Completed):
        if stats is not None:
            stats.count("completed", at, group, exec_name, client_id)
            if life.started_at is not None:
                stats.run_time(at - life.started_at, at, group, exec_name, client_id)
    elif isinstance(event, Requeued | Redriven):
        if stats is not None:
            name = "requeued" if isinstance(event, Requeued) else "redriven"
            stats.count(name, at, group, exec_name, client_id)
        life.queued_at = at
        life.started_at = None if isinstance(event, Redriven) else life.started_at
    elif isinstance(event, DeadLettered | Cancelled) and stats is not None:
        name = "dead" if isinstance(event, DeadLettered) else "cancelled"
        stats.count(name, at, group, exec_name, client_id)
    return life


def fold_batch(
    events: Sequence[LoggedEvent],
    admitted: Sequence[bool],
    current: Mapping[JobKey, JobState],
    *,
    count_stats: Callable[[LoggedEvent], bool] = lambda _: True,
    unreadable: Mapping[JobKey, str] | None = None,
) -> BatchFold:
    """Fold a batch's admitted events into the touched jobs' states.

    `current` holds the pre-batch state of every touched job that has a `jobs` row (a job
    absent from it is new; in a batch with `pruned` events it must also hold the touched
    jobs' closed rows). `count_stats` says which events the statistics have not counted yet
    (after a crash, `stats` may already hold part of a replayed batch). `unreadable`: jobs
    whose `jobs` row could not be read back, and why; their events are refused and their
    rows left as they are.

    An event that does not fit its job is refused (`BatchFold.refused`, naming why) and the
    job keeps its state before it.
    """
    result = BatchFold()
    per_job: dict[JobKey, list[int]] = {}
    group_prunes: dict[str, list[int]] = {}
    for index, (logged, ok) in enumerate(zip(events, admitted, strict=True)):
        if not ok:
            continue
        event = logged.event
        if isinstance(event, JobEvent):
            per_job.setdefault((logged.group, event.job_id), []).append(index)
        elif isinstance(event, Pruned):
            group_prunes.setdefault(logged.group, []).append(index)
    for group, indexes in group_prunes.items():
        steps: list[PruneStep] = []
        for index in indexes:
            prune = events[index].event
            assert isinstance(prune, Pruned)
            steps.append(PruneStep(prune.at, prune.before))
        result.prunes[group] = steps

    broken = unreadable or {}
    for key, indexes in per_job.items():
        if key in broken:
            reason = f"its jobs row does not read back: {broken[key]}"
            result.refused.extend(Refused(events[index], reason) for index in indexes)
            continue
        state = current.get(key)
        walk = _JobWalk(key, state, events, group_prunes.get(key[0], []), result, count_stats)
        final = walk.run(indexes)
        if final is not None or state is not None:
            result.final[key] = final
    result.refused.sort(key=lambda refused: place(refused.logged))
    return result


def place(logged: LoggedEvent) -> tuple[int, int, int]:
    """Where an event stands in the log: the order of refusals and of their reasons."""
    return (logged.partition, logged.offset, logged.index)


class _JobWalk:
    """One job's events (and its group's prunes) in log order: the core folds runs of job
    events between prunes with `fold_job_events`; each prune may archive the life.

    A run is folded whole first (the common case: every event fits). If the core refuses an
    event of it, the run is folded again one event at a time from the state before it,
    refusing the events that do not fit. The statistics and the life's timestamps follow
    only the events applied."""

    def __init__(
        self,
        key: JobKey,
        state: JobState | None,
        events: Sequence[LoggedEvent],
        prunes: Sequence[int],
        result: BatchFold,
        count_stats: Callable[[LoggedEvent], bool],
    ) -> None:
        self.key = key
        self.group = key[0]
        self.record = None if state is None else state.record
        self.life = _life_of(state)
        self.events = events
        self.prunes = prunes
        self.next_prune = 0
        self.result = result
        self.count_stats = count_stats
        self.segment: list[int] = []
        """Indexes (into `events`) of the job events not folded yet."""

    def run(self, indexes: Sequence[int]) -> JobState | None:
        for index in indexes:
            self._prune_until(index)
            self.segment.append(index)
        self._flush()
        self._prune_until(len(self.events))
        if self.record is None:
            return None
        assert self.life is not None
        return JobState(self.record, self.life.queued_at, self.life.started_at)

    def _flush(self) -> None:
        if not self.segment:
            return
        segment, self.segment = self.segment, []
        events = self.events
        try:
            self.record = fold_job_events(self.record, [events[index].event for index in segment])
        except InvalidTransition:
            # Again one event at a time from the state before the run (the failed fold
            # worked on a copy), refusing the events that do not fit.
            for index in segment:
                self._apply_one(index)
            return
        for index in segment:
            self._observe(index)

    def _apply_one(self, index: int) -> None:
        logged = self.events[index]
        try:
            self.record = fold_job_events(self.record, [logged.event])
        except InvalidTransition as error:
            self.result.refused.append(Refused(logged, f"does not fit its job: {error}"))
            return
        self._observe(index)

    def _observe(self, index: int) -> None:
        logged = self.events[index]
        event = logged.event
        assert isinstance(event, JobEvent)
        counted = self.result.stats if self.count_stats(logged) else None
        self.life = _observe(self.life, event, self.group, counted)

    def _prune_until(self, limit: int) -> None:
        """Apply the group's prunes that come before log index `limit`."""
        prunes = self.prunes
        while self.next_prune < len(prunes) and prunes[self.next_prune] < limit:
            self._flush()
            prune = self.events[prunes[self.next_prune]].event
            assert isinstance(prune, Pruned)
            self.next_prune += 1
            record = self.record
            if (
                record is not None
                and record.status in CLOSED_STATUSES
                and record.updated_at <= prune.before
            ):
                assert self.life is not None
                archived = JobState(record, self.life.queued_at, self.life.started_at)
                self.result.archived.append(ArchivedLife(self.group, archived, prune.at))
                self.record = None
                self.life = None


def archived_row(life: ArchivedLife) -> dict[str, Any]:
    """The `jobs_archive` row of a pruned life (`date`: the UTC day of its last update)."""
    row = job_row(life.group, life.state)
    del row["part"]
    row["archived_at"] = life.archived_at
    row["date"] = dt.datetime.fromtimestamp(row["updated_at"], dt.UTC).date()
    return row

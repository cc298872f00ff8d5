"""What one micro-batch writes, however it was folded: on the driver (`BatchWriter._plan`)
or on Spark's executors (`dispatch.streaming.executor_plan`). `BatchWriter` writes either the same
way, so exactly once, the write order and the progress records do not depend on where the fold ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dispatch.core.events import Event
from dispatch.delta import tables as t
from dispatch.delta.job_rows import JobKey
from dispatch.delta.stats import MinuteStats, StatsKey
from dispatch.streaming.fold import PruneStep

if TYPE_CHECKING:
    from dispatch.streaming.spark_writes import ExecutorRows

JOBS_SOURCE = t.SCHEMAS[t.JOBS].append(pa.field("_delete", pa.bool_()))
"""The `jobs` MERGE source: the table's columns and whether the job leaves `jobs`."""


@dataclass
class Planned:
    """One batch's rows, ready to commit (every table's rows in its own Arrow schema)."""

    events: pa.Table
    """`events` rows the table has not absorbed yet."""
    rejected: pa.Table
    """`rejected` rows the table has not absorbed yet."""
    stats: dict[StatsKey, MinuteStats]
    """The batch's statistics, not counted before (`stats_partial` gets a row per key)."""
    jobs_source: pa.Table
    """The `jobs` MERGE source (`JOBS_SOURCE`): a row per touched job (`_delete`: pruned,
    gone)."""
    fence_after: dict[str, int]
    """Each group's fence epoch after the batch."""
    archived: list[dict[str, Any]] = field(default_factory=list)
    """`jobs_archive` rows of the touched lives the batch's prunes ended."""
    prunes: dict[str, list[PruneStep]] = field(default_factory=dict)
    """Per group, the batch's admitted `pruned` events in log order."""
    touched: set[JobKey] = field(default_factory=set)
    """The jobs the batch's events touch (filled only for a batch with prunes)."""
    closed_touched: list[JobKey] = field(default_factory=list)
    """Touched jobs whose row was closed (only a batch with prunes may touch one)."""
    pauses: list[tuple[str, Event]] = field(default_factory=list)
    """The batch's admitted `paused` and `resumed` events with their groups, in log order
    (they rewrite the `pauses` table)."""
    limits: list[tuple[str, Event]] = field(default_factory=list)
    """The batch's admitted `limit_set` and `limit_removed` events with their groups, in log
    order (they rewrite the `limits` table)."""
    events_count: int = 0
    """Logged events decoded (for the logs and the benchmark)."""
    skipped_records: int = 0
    """Events records the fold did not take whole (each has a `rejected` row)."""
    first_reason: str | None = None
    """Why the first of them was skipped, for the batch's warning."""
    open_seqs: list[int | None] | None = None
    """The `seq` of every touched job's row in the open partition as stored, when the fold
    read them (on the driver): the `jobs` MERGE then scans only the files that may hold them
    (`BatchWriter._merge_jobs`). None: unknown, the MERGE scans the whole open partition."""
    on_executors: ExecutorRows | None = None
    """A batch folded on the executors: its `jobs` source (and usually its `events` rows)
    as Spark DataFrames, written by Spark; `jobs_source` (and then `events`) are empty."""
    release: Callable[[], None] = field(default=lambda: None)
    """Frees what the plan keeps cached on the executors; called once the batch is written."""

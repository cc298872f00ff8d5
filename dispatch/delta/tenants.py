"""Tenant service levels from the per-minute statistics: per client and exec over a window,
the counters, queue-wait percentiles and the breaches of the client's wait target.

Breaches are computed when the statistics are read, from each `stats` row's queue-wait
histogram (docs/streaming.md, *Tenant SLAs*): the fold knows no targets, so a target can change
and apply to the history at once, and the tables keep their schema. A histogram cannot say on
which side of the target a wait in the target's own bucket fell, so the target is taken at the
nearest bucket boundary: every wait more than 4.4 % above the target counts, none more than
4.4 % below it does. A row whose every wait is on one side (its min and max say so) is counted
exactly. Targets under the first bucket's 1 ms are taken as 1 ms.

Reading is delta-rs only (no JVM): `stats` at one version plus the `stats_partial` rows that
version has not rolled up yet, so the window is as fresh as the last micro-batch, not the last
roll-up, and no row is counted twice.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dispatch.delta import tables as t
from dispatch.delta.stats import BUCKET_FLOOR_S, GROWTH, MAX_BUCKET, Histogram, minute_of

if TYPE_CHECKING:
    from dispatch.warehouse import Warehouse

UTC = dt.UTC

TENANT_COUNTERS: tuple[str, ...] = ("submitted", "started", "completed", "dead")
"""The `stats` counters a tenant's view shows."""

_WAIT = "queue_wait"
_READ_COLUMNS = [
    "minute",
    "dispatch_group",
    "exec",
    "client_id",
    *TENANT_COUNTERS,
    *(f"{_WAIT}_{suffix}" for suffix in ("n", "sum_s", "min_s", "max_s", "hist")),
]
"""What a tenant view reads of a stats row (not the run times)."""

BOUNDARY_ERROR = math.sqrt(GROWTH) - 1.0
"""How far the boundary a target is taken at can be from the target (relative, ~4.4 %)."""


def breach_boundary(target_s: float) -> int:
    """The bucket boundary a target is taken at: k such that 1 ms * r^k is the boundary
    nearest the target (0: 1 ms, for targets under it; at most MAX_BUCKET)."""
    if not target_s > BUCKET_FLOOR_S:  # also NaN
        return 0
    nearest = round(math.log(target_s / BUCKET_FLOOR_S) / math.log(GROWTH))
    return max(0, min(int(nearest), MAX_BUCKET))


def breaches(waits: Histogram, target_s: float) -> int:
    """How many of the histogram's waits were longer than `target_s` (see the module's
    docstring for the precision)."""
    if waits.count == 0:
        return 0
    if waits.maximum is not None and waits.maximum <= target_s:
        return 0
    if waits.minimum is not None and waits.minimum > target_s:
        return waits.count
    # Bucket k >= 1 holds (1 ms * r^(k-1), 1 ms * r^k]: above boundary b are buckets b+1...
    boundary = breach_boundary(target_s)
    return sum(count for bucket, count in waits.buckets.items() if bucket > boundary)


@dataclass(slots=True)
class TenantTotals:
    """A client's (or one exec's of a client) sums over the window."""

    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TENANT_COUNTERS, 0))
    queue_wait: Histogram = field(default_factory=Histogram)
    breaches: int = 0

    def add_row(self, row: Mapping[str, Any], target_s: float) -> None:
        """One `stats` row; its breaches are counted against `target_s` before its histogram
        joins the others (its own min and max make that count exact more often)."""
        for name in TENANT_COUNTERS:
            self.counters[name] += int(row.get(name) or 0)
        waits = Histogram.from_columns(row, _WAIT)
        self.breaches += breaches(waits, target_s)
        self.queue_wait.merge(waits)

    def merge(self, other: TenantTotals) -> None:
        for name in TENANT_COUNTERS:
            self.counters[name] += other.counters[name]
        self.queue_wait.merge(other.queue_wait)
        self.breaches += other.breaches

    def columns(self) -> dict[str, Any]:
        waits = self.queue_wait
        return {
            **self.counters,
            "queue_wait_n": waits.count,
            "queue_wait_p50_s": waits.percentile(0.50),
            "queue_wait_p95_s": waits.percentile(0.95),
            "queue_wait_p99_s": waits.percentile(0.99),
            "queue_wait_max_s": waits.maximum,
            "breaches": self.breaches,
        }


@dataclass(slots=True)
class TenantReport:
    """One client over the window: its totals and each exec's."""

    client_id: str
    target_s: float
    total: TenantTotals = field(default_factory=TenantTotals)
    execs: dict[str, TenantTotals] = field(default_factory=dict)

    def add_row(self, row: Mapping[str, Any]) -> None:
        exec_name = str(row["exec"])
        one = self.execs.get(exec_name)
        if one is None:
            one = self.execs[exec_name] = TenantTotals()
        one.add_row(row, self.target_s)

    def finish(self) -> TenantReport:
        """Sum the execs into the client's total (once, after the last row)."""
        total = TenantTotals()
        for exec_name in sorted(self.execs):
            total.merge(self.execs[exec_name])
        self.total = total
        return self


def tenant_reports(
    rows: Iterable[Mapping[str, Any]], target_for: Callable[[str], float]
) -> dict[str, TenantReport]:
    """Stats rows (of one group and window) summed per client and exec, by client id."""
    reports: dict[str, TenantReport] = {}
    for row in rows:
        client_id = str(row["client_id"])
        report = reports.get(client_id)
        if report is None:
            report = reports[client_id] = TenantReport(client_id, target_for(client_id))
        report.add_row(row)
    return {client_id: reports[client_id].finish() for client_id in sorted(reports)}


def window_start(now: float, minutes: int) -> float:
    """The first minute of a window of `minutes` minutes ending with `now`'s minute."""
    return float(minute_of(now) - (minutes - 1) * 60)


def read_window(
    warehouse: Warehouse, group: str, since: float, until: float
) -> list[dict[str, Any]]:
    """The group's `stats` rows (queue-wait and counter columns) of the minutes from `since`
    to `until`: the rolled-up table at one version, plus the partial rows that version does
    not hold yet. Empty when the tables do not exist yet.

    The partial rows are read first: whatever a roll-up moves between the two reads is then
    in the `stats` version read (and left out of the partial rows by its `batch_end`), so no
    row is missed or counted twice."""
    from dispatch.delta.progress import newest_commit, parse_rollup

    partial_table = warehouse.open_if_exists(t.STATS_PARTIAL)
    partial = (
        []
        if partial_table is None
        else partial_table.to_pyarrow_table(columns=[*_READ_COLUMNS, "batch_end"]).to_pylist()
    )
    rows: list[dict[str, Any]] = []
    through = 0
    stats_table = warehouse.open_if_exists(t.STATS)
    if stats_table is not None:
        found = newest_commit(stats_table, parse_rollup)
        through = 0 if found is None else found[2]
        rows = _rolled_up(stats_table, since, until)
    rows += [row for row in partial if int(row["batch_end"]) > through]
    return [
        row for row in rows if row["dispatch_group"] == group and since <= _minute(row) <= until
    ]


def _rolled_up(stats_table: Any, since: float, until: float) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    first = dt.datetime.fromtimestamp(since, UTC)
    last_day = dt.datetime.fromtimestamp(max(since, until), UTC).date()
    days: list[str] = []
    day = first.date()
    while day <= last_day:
        days.append(day.isoformat())
        day += dt.timedelta(days=1)
    dataset = stats_table.to_pyarrow_dataset(
        # Partition pruning by day, then a filter on the timestamp (never on a string
        # column: pyarrow has no kernel for the string_view columns MERGE writes).
        file_pruning_predicate=[("date", "in", days)]
    )
    bound = pa.scalar(first, t.SCHEMAS[t.STATS].field("minute").type)
    table = dataset.to_table(columns=_READ_COLUMNS, filter=pc.field("minute") >= bound)
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _minute(row: Mapping[str, Any]) -> float:
    minute: dt.datetime = row["minute"]
    if minute.tzinfo is None:
        minute = minute.replace(tzinfo=UTC)
    return minute.timestamp()

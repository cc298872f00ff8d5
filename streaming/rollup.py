"""Rolling `stats_partial` up into `stats`: one exact row per minute, group, exec and client.

Each micro-batch appends its statistics as partial rows (an append costs a fraction of a MERGE,
and freshness depends on the batch time). Every `rollup_every_s` (and when the application
stops), the roll-up adds the partial rows not rolled up yet to their `stats` rows with one MERGE,
then deletes them from `stats_partial`.

Exactly once: each partial row carries `batch_end`, a number that grows with every batch (the
sum of the events topic's end offsets of its batch). The roll-up's MERGE commit records the
highest `batch_end` it added (`{"dispatch_rollup": 1, "through": N}` in its user metadata), and
is keyed on it (a `txn` action with app id "<app>-rollup", version N); the next roll-up only
takes rows above it. A crash between the MERGE and the DELETE leaves rows the next roll-up skips
and deletes.

Both commits are delta-rs's (`dispatch.streaming.delta_commits`), like the batch's: a Spark MERGE
cost seconds every `rollup_every_s` (BENCHMARKS.md, *Streaming*), and the batch that ran it held
every event behind it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from dispatch.delta import tables as t
from dispatch.delta.progress import newest_commit, parse_rollup, rollup_metadata
from dispatch.delta.stats import MinuteStats, StatsKey
from dispatch.streaming.delta_commits import DeltaCommits

if TYPE_CHECKING:
    from dispatch.warehouse import Warehouse

log = logging.getLogger(__name__)

UTC = dt.UTC


def key_of(row: dict[str, Any]) -> StatsKey:
    minute: dt.datetime = row["minute"]
    if minute.tzinfo is None:
        minute = minute.replace(tzinfo=UTC)
    return (int(minute.timestamp()), row["dispatch_group"], row["exec"], row["client_id"])


def stats_row(key: StatsKey, stats: MinuteStats) -> dict[str, Any]:
    """A `stats` row (the partial rows are these without the percentile columns)."""
    minute, group, exec_name, client_id = key
    moment = dt.datetime.fromtimestamp(minute, UTC)
    row: dict[str, Any] = {
        "date": moment.date(),
        "minute": moment,
        "dispatch_group": group,
        "exec": exec_name,
        "client_id": client_id,
    }
    row.update(stats.columns())
    return row


def aggregate(rows: Iterable[dict[str, Any]]) -> dict[StatsKey, MinuteStats]:
    """Sum rows (partial or rolled up) per key."""
    out: dict[StatsKey, MinuteStats] = {}
    for row in rows:
        key = key_of(row)
        stats = MinuteStats.from_columns(row)
        if key in out:
            out[key].merge(stats)
        else:
            out[key] = stats
    return out


class StatsRollup:
    """Runs the roll-up when it is due, and on demand."""

    def __init__(
        self,
        warehouse: Warehouse,
        every_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_s = every_s
        self.clock = clock
        self._last = clock()
        self.commits = DeltaCommits(warehouse)

    def due(self) -> bool:
        return self.every_s <= 0 or self.clock() - self._last >= self.every_s

    def rolled_through(self) -> int:
        """The highest `batch_end` already in `stats` (0: none)."""
        found = newest_commit(self.commits.table(t.STATS), parse_rollup)
        return 0 if found is None else found[2]

    def run(self, app_id: str) -> int:
        """Roll up what is pending; returns the number of `stats` rows written."""
        self._last = self.clock()
        through = self.rolled_through()
        partial = self.commits.table(t.STATS_PARTIAL).to_pyarrow_table().to_pylist()
        pending = [row for row in partial if row["batch_end"] > through]
        written = 0
        if pending:
            new_through = max(int(row["batch_end"]) for row in pending)
            additions = aggregate(pending)
            merged = self._existing(additions)
            for key, stats in additions.items():
                if key in merged:
                    merged[key].merge(stats)
                else:
                    merged[key] = stats
            rows = [stats_row(key, merged[key]) for key in sorted(additions)]
            self._merge(rows, app_id, new_through)
            through = new_through
            written = len(rows)
        if partial:
            self.commits.table(t.STATS_PARTIAL).delete(f"batch_end <= {through}")
        return written

    def _existing(self, keys: Iterable[StatsKey]) -> dict[StatsKey, MinuteStats]:
        wanted = set(keys)
        days = sorted({dt.datetime.fromtimestamp(key[0], UTC).date() for key in wanted})
        dataset = self.commits.table(t.STATS).to_pyarrow_dataset(
            file_pruning_predicate=[("date", "in", [day.isoformat() for day in days])]
        )
        minutes = pa.array(
            [dt.datetime.fromtimestamp(m, UTC) for m in sorted({key[0] for key in wanted})],
            t.SCHEMAS[t.STATS].field("minute").type,
        )
        found = dataset.to_table(filter=pc.field("minute").isin(minutes)).to_pylist()
        return aggregate(row for row in found if key_of(row) in wanted)

    def _merge(self, rows: list[dict[str, Any]], app_id: str, through: int) -> None:
        dates = sorted({row["date"].isoformat() for row in rows})
        condition = (
            f"t.date IN ({', '.join(f'CAST({day!r} AS DATE)' for day in dates)})"
            " AND t.minute = s.minute AND t.dispatch_group = s.dispatch_group"
            " AND t.exec = s.exec AND t.client_id = s.client_id"
        )
        columns = {name: f"s.`{name}`" for name in t.SCHEMAS[t.STATS].names}
        written = self.commits.merge(
            t.STATS,
            t.arrow_rows(t.STATS, rows),
            condition,
            lambda merge: merge.when_matched_update(updates=columns).when_not_matched_insert(
                updates=columns
            ),
            app_id=f"{app_id}-rollup",
            version=through,
            metadata=rollup_metadata(through),
        )
        if written is None:
            return
        log.info("stats roll-up through batch_end %d: %d rows", through, len(rows))

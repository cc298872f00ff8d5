"""Compaction (OPTIMIZE) and VACUUM on a schedule, so MERGE cost stays flat as history grows.

Every micro-batch adds a few small files to each table (and rewrites the files of `jobs`'
open partition it touches). Compaction bins the small files together; files already at least
`target_file_mb` are left alone, so a run costs what was added since the last one, not the size
of the history. VACUUM then deletes the files no version within the retention still uses.

Maintenance runs inside `foreachBatch`, after a batch's writes: the application is the only
writer of its tables, so maintenance never conflicts with a batch. Its commits carry no
`Progress`; readers of the snapshot pointer skip them.

Compaction is delta-rs's (`optimize.compact`), VACUUM Spark's: a Spark OPTIMIZE of one table
took seconds, and the batch that ran it held every event behind it; delta-rs bins the same
small files several times faster (BENCHMARKS.md, *Streaming: freshness and MERGE cost*).
VACUUM runs once a day per table and Spark's LITE mode reads the log instead of listing
folders, which delta-rs does not offer.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dispatch.delta import tables as t
from dispatch.delta.job_rows import CLOSED

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from dispatch.warehouse import Warehouse

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MaintenancePolicy:
    optimize_every_s: float = 600.0
    """Compact every table this often (0 disables)."""
    vacuum_every_s: float = 24 * 3600.0
    """Vacuum every table this often (0 disables)."""
    vacuum_retain_hours: float = 168.0
    """Files unused for this long are deleted. Below 168 h Delta's safety check is turned off
    for the VACUUM: time travel (and readers slower than this) then lose older versions."""
    recent_days: int = 2
    """Date-partitioned tables: compact only the partitions of the last days (older ones were
    compacted when they were recent, and nothing writes to them any more)."""
    target_file_mb: int = 64
    """Target size of a compacted file; files at least this big are not compacted again, so
    a step rewrites at most about this much per partition besides the new small files."""


_DATE_PARTITIONED = (t.EVENTS, t.STATS, t.REJECTED, t.JOBS_ARCHIVE)
"""Compacted partition by partition; `stats_partial` (emptied by every roll-up) whole."""

_COMPACTED_PARTS: dict[str, list[tuple[str, str, str]]] = {t.JOBS: [("part", "=", CLOSED)]}
"""Tables compacted in part only. `jobs`: its closed partition; the open one keeps the files
each batch's MERGE writes (`tables.JOBS_FILE_BYTES` each): binning them together would join
rows queued at different times into files whose `seq` statistics cover them all, and every
batch's MERGE would then scan and rewrite those big files for the few rows it changes."""


class Maintenance:
    """Runs OPTIMIZE and VACUUM when they are due, one table per step.

    Each table is compacted every `optimize_every_s` (vacuumed every `vacuum_every_s`), but the
    tables take turns, a step every interval / number of tables: a batch that runs maintenance
    pays for one table, not for all of them at once."""

    def __init__(
        self,
        warehouse: Warehouse,
        policy: MaintenancePolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.warehouse = warehouse
        self.policy = policy or MaintenancePolicy()
        self.clock = clock
        self.tables = list(t.SCHEMAS)
        started = clock()
        self._last = {"optimize": started, "vacuum": started}
        self._turn = {"optimize": 0, "vacuum": 0}

    def run_due(self, spark: SparkSession) -> list[str]:
        """Run the steps that are due; returns them ("optimize <table>", "vacuum <table>")."""
        ran: list[str] = []
        policy = self.policy
        for kind, every_s in (
            ("optimize", policy.optimize_every_s),
            ("vacuum", policy.vacuum_every_s),
        ):
            if not every_s or self.clock() - self._last[kind] < every_s / len(self.tables):
                continue
            name = self.tables[self._turn[kind] % len(self.tables)]
            self._turn[kind] += 1
            if kind == "optimize":
                self.optimize([name])
            else:
                self.vacuum(spark, [name])
            self._last[kind] = self.clock()
            ran.append(f"{kind} {name}")
        return ran

    @contextmanager
    def _confs(self, spark: SparkSession, values: dict[str, str]) -> Iterator[None]:
        conf = spark.conf
        for key, value in values.items():
            conf.set(key, value)
        try:
            yield
        finally:
            for key in values:
                conf.unset(key)

    def optimize(self, names: list[str] | None = None) -> dict[str, float]:
        """Compact the tables (all by default; recent partitions only where partitioned by
        date)."""
        policy = self.policy
        since = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=policy.recent_days)
        took: dict[str, float] = {}
        for name in names or self.tables:
            started = time.perf_counter()
            table = self.warehouse.open(name)
            recent = [("date", ">=", since.isoformat())] if name in _DATE_PARTITIONED else None
            table.optimize.compact(
                partition_filters=_COMPACTED_PARTS.get(name, recent),
                target_size=policy.target_file_mb * 1024 * 1024,
                # One core is the batch's: compaction may take the other.
                max_concurrent_tasks=1,
            )
            took[name] = time.perf_counter() - started
        log.info("optimize: %s", {name: round(s, 2) for name, s in took.items()})
        return took

    def vacuum(self, spark: SparkSession, names: list[str] | None = None) -> dict[str, float]:
        """Delete the files no version within the retention uses.

        LITE mode finds them in the Delta log instead of listing the table's folders (an
        order of magnitude faster, BENCHMARKS.md, *Streaming*, and it does not grow with the
        number of partitions);
        it refuses when the log no longer covers the retention (e.g. after a long stop), and
        then the full listing runs once."""
        from pyspark.errors import PySparkException

        hours = self.policy.vacuum_retain_hours
        confs = {}
        if hours < 168:
            confs["spark.databricks.delta.retentionDurationCheck.enabled"] = "false"
        took: dict[str, float] = {}
        with self._confs(spark, confs):
            for name in names or self.tables:
                started = time.perf_counter()
                path = self.warehouse.table(name).replace("`", "``")
                try:
                    spark.sql(f"VACUUM delta.`{path}` RETAIN {hours:g} HOURS LITE").collect()
                except PySparkException as error:
                    log.warning("VACUUM LITE of %s refused (%s); listing the table", name, error)
                    spark.sql(f"VACUUM delta.`{path}` RETAIN {hours:g} HOURS").collect()
                took[name] = time.perf_counter() - started
        log.info("vacuum: %s", {name: round(s, 2) for name, s in took.items()})
        return took

"""Per-minute statistics: counters and mergeable latency histograms.

A minute's events reach the fold over several micro-batches, so a `stats` row must be
updatable by addition. Percentiles are not additive, so each row keeps, for queue wait and for
run time, a sparse log-scale histogram (bucket -> count) plus count, sum, min and max; these add
up exactly across batches (and across minutes, execs or clients in a query), and the p50/p95/p99
columns are recomputed from the merged histogram every time a row changes.

Buckets: bucket 0 holds values up to 1 ms; bucket k >= 1 holds (1 ms * r^(k-1), 1 ms * r^k]
with r = 2^(1/8), so a percentile read from a bucket's geometric middle is within about 4.4 %
of the true value (and is clamped to the observed min/max). Values above ~10 days share the
last bucket. No t-digest, nothing probabilistic: the same events always give the same row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

BUCKET_FLOOR_S = 0.001
"""Upper bound of bucket 0."""
BUCKETS_PER_DOUBLING = 8
GROWTH = 2.0 ** (1.0 / BUCKETS_PER_DOUBLING)
MAX_BUCKET = 240
"""Bucket of everything above 1 ms * r^239 (about 10.6 days)."""
_LOG_GROWTH = math.log(GROWTH)

PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
"""The percentile columns each latency gets: name suffix and quantile."""

COUNTERS: tuple[str, ...] = (
    "submitted",
    "started",
    "retries",
    "completed",
    "requeued",
    "dead",
    "cancelled",
    "redriven",
)
"""Event counters of a stats row (see docs/streaming.md for their exact definitions)."""

LATENCIES: tuple[str, ...] = ("queue_wait", "run_time")


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a duration (negative durations count as 0)."""
    if not seconds > BUCKET_FLOOR_S:  # also catches NaN
        return 0
    bucket = math.ceil(math.log(seconds / BUCKET_FLOOR_S) / _LOG_GROWTH)
    # Floating-point log can land one bucket high at an exact boundary.
    if bucket > 1 and seconds <= BUCKET_FLOOR_S * GROWTH ** (bucket - 1):
        bucket -= 1
    return max(1, min(bucket, MAX_BUCKET))


def bucket_value(bucket: int) -> float:
    """A bucket's representative duration: its geometric middle (bucket 0: half of 1 ms)."""
    if bucket <= 0:
        return BUCKET_FLOOR_S / 2
    return float(BUCKET_FLOOR_S * GROWTH ** (bucket - 0.5))


@dataclass(slots=True)
class Histogram:
    """A mergeable latency summary: count, sum, min, max and sparse bucket counts."""

    count: int = 0
    total: float = 0.0
    minimum: float | None = None
    maximum: float | None = None
    buckets: dict[int, int] = field(default_factory=dict)

    def add(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.count += 1
        self.total += seconds
        self.minimum = seconds if self.minimum is None else min(self.minimum, seconds)
        self.maximum = seconds if self.maximum is None else max(self.maximum, seconds)
        bucket = bucket_of(seconds)
        self.buckets[bucket] = self.buckets.get(bucket, 0) + 1

    def merge(self, other: Histogram) -> None:
        self.count += other.count
        self.total += other.total
        if other.minimum is not None:
            mine = self.minimum
            self.minimum = other.minimum if mine is None else min(mine, other.minimum)
        if other.maximum is not None:
            mine = self.maximum
            self.maximum = other.maximum if mine is None else max(mine, other.maximum)
        for bucket, count in other.buckets.items():
            self.buckets[bucket] = self.buckets.get(bucket, 0) + count

    def percentile(self, quantile: float) -> float | None:
        """Nearest-rank percentile estimate, or None when empty."""
        if self.count == 0:
            return None
        rank = max(1, math.ceil(quantile * self.count))
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                estimate = bucket_value(bucket)
                assert self.minimum is not None and self.maximum is not None
                return min(max(estimate, self.minimum), self.maximum)
        return self.maximum

    def columns(self, prefix: str) -> dict[str, Any]:
        """This histogram as `stats` columns named `<prefix>_...`."""
        out: dict[str, Any] = {
            f"{prefix}_n": self.count,
            f"{prefix}_sum_s": self.total,
            f"{prefix}_min_s": self.minimum,
            f"{prefix}_max_s": self.maximum,
            # Sorted, so equal histograms give equal rows.
            f"{prefix}_hist": sorted(self.buckets.items()),
        }
        for name, quantile in PERCENTILES:
            out[f"{prefix}_{name}_s"] = self.percentile(quantile)
        return out

    @classmethod
    def from_columns(cls, row: Mapping[str, Any], prefix: str) -> Histogram:
        """Read back what `columns` wrote (a Delta map column arrives as pairs or a dict)."""
        raw = row.get(f"{prefix}_hist") or []
        pairs: Iterable[tuple[Any, Any]] = raw.items() if isinstance(raw, Mapping) else raw
        return cls(
            count=int(row.get(f"{prefix}_n") or 0),
            total=float(row.get(f"{prefix}_sum_s") or 0.0),
            minimum=row.get(f"{prefix}_min_s"),
            maximum=row.get(f"{prefix}_max_s"),
            buckets={int(bucket): int(count) for bucket, count in pairs},
        )


StatsKey = tuple[int, str, str, str]
"""(minute as unix seconds, dispatch group, exec, client id)."""


@dataclass(slots=True)
class MinuteStats:
    """One `stats` row: what happened in one minute for one (group, exec, client)."""

    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    queue_wait: Histogram = field(default_factory=Histogram)
    run_time: Histogram = field(default_factory=Histogram)

    def merge(self, other: MinuteStats) -> None:
        for name in COUNTERS:
            self.counters[name] += other.counters[name]
        self.queue_wait.merge(other.queue_wait)
        self.run_time.merge(other.run_time)

    def columns(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        out.update(self.queue_wait.columns("queue_wait"))
        out.update(self.run_time.columns("run_time"))
        return out

    @classmethod
    def from_columns(cls, row: Mapping[str, Any]) -> MinuteStats:
        return cls(
            counters={name: int(row.get(name) or 0) for name in COUNTERS},
            queue_wait=Histogram.from_columns(row, "queue_wait"),
            run_time=Histogram.from_columns(row, "run_time"),
        )


def minute_of(at: float) -> int:
    """The start of `at`'s minute, in unix seconds."""
    return math.floor(at / 60.0) * 60


class StatsAccumulator:
    """Collects one batch's contributions, keyed by minute, group, exec and client."""

    def __init__(self) -> None:
        self.rows: dict[StatsKey, MinuteStats] = {}

    def _row(self, at: float, group: str, exec_name: str, client_id: str) -> MinuteStats:
        key = (minute_of(at), group, exec_name, client_id)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = MinuteStats()
        return row

    def count(self, name: str, at: float, group: str, exec_name: str, client_id: str) -> None:
        self._row(at, group, exec_name, client_id).counters[name] += 1

    def queue_wait(
        self, seconds: float, at: float, group: str, exec_name: str, client_id: str
    ) -> None:
        self._row(at, group, exec_name, client_id).queue_wait.add(seconds)

    def run_time(
        self, seconds: float, at: float, group: str, exec_name: str, client_id: str
    ) -> None:
        self._row(at, group, exec_name, client_id).run_time.add(seconds)

    def __bool__(self) -> bool:
        return bool(self.rows)

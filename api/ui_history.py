"""A short per-second history of one node's metrics, for the dashboard's charts.

The leader already counts what it commits in its Prometheus registry (`api/metrics.py`):
enqueued, assigned, completed, dead and requeued jobs, the submit-to-first-assignment and
commit-time histograms, the queue depth and in-flight gauges. A `Sampler` reads that registry
once a second and a `History` keeps the last few minutes as points: rates from the counters'
differences, latency percentiles from the histograms' bucket differences (estimated like
Prometheus' `histogram_quantile`), gauges as read. Reading the registry needs no hook in the
leader loop, and the cost is one registry scan a second, whatever the job rate.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

COUNTERS = ("enqueued", "assigned", "completed", "dead", "requeued")
"""Counters of `dispatch.api.metrics.Metrics` charted as rates; registry name `dispatch_<name>`."""

HISTOGRAMS = {
    "dispatch": "dispatch_dispatch_latency_seconds",
    "commit": "dispatch_commit_seconds",
}
"""Histograms charted as percentiles: short name -> registry name."""

QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}

Buckets = tuple[tuple[float, float], ...]
"""A histogram's cumulative counts: ((upper bound, observations at or below it), ...),
ascending, ending with (inf, total)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """The registry's cumulative values at one moment."""

    at: float
    counters: dict[str, float]
    histograms: dict[str, Buckets]
    queued: float
    """Ready plus delayed jobs, over all execs."""
    in_flight: float


def read_registry(registry: CollectorRegistry, at: float) -> Reading:
    """One scan of the registry (cheap: a handful of metrics, read under their own locks)."""
    counters = dict.fromkeys(COUNTERS, 0.0)
    bucket_lists: dict[str, list[tuple[float, float]]] = {name: [] for name in HISTOGRAMS}
    histogram_names = {registry_name: name for name, registry_name in HISTOGRAMS.items()}
    queued = in_flight = 0.0
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "dispatch_queue_depth":
                queued += sample.value
            elif sample.name == "dispatch_in_flight":
                in_flight = sample.value
            elif sample.name.endswith("_total"):
                counter = sample.name.removeprefix("dispatch_").removesuffix("_total")
                if counter in counters:
                    counters[counter] = sample.value
            elif sample.name.endswith("_bucket"):
                histogram = histogram_names.get(sample.name.removesuffix("_bucket"))
                if histogram is not None:
                    bound = float(sample.labels["le"])  # "+Inf" parses as inf
                    bucket_lists[histogram].append((bound, sample.value))
    histograms = {name: tuple(sorted(buckets)) for name, buckets in bucket_lists.items()}
    return Reading(at, counters, histograms, queued, in_flight)


def bucket_difference(later: Buckets, earlier: Buckets) -> Buckets:
    """The observations made between two readings of the same histogram, per bucket."""
    before = dict(earlier)
    return tuple((bound, max(0.0, count - before.get(bound, 0.0))) for bound, count in later)


def quantile(buckets: Buckets, q: float) -> float | None:
    """The q-quantile estimated from cumulative bucket counts, as Prometheus'
    `histogram_quantile` does: linear interpolation inside the bucket that holds it (the
    first bucket starts at 0); in the +Inf bucket, the largest finite bound. None when the
    histogram saw nothing."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound = lower_count = 0.0
    for bound, count in buckets:
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


@dataclass(frozen=True, slots=True)
class Point:
    """What happened between two readings: rates per second, latency percentiles (seconds,
    None when nothing was observed), and the gauges at the end of the interval."""

    t: float
    rates: dict[str, float]
    latency: dict[str, float | None]
    """`<histogram>_<quantile>`, e.g. `dispatch_p95`."""
    queued: float
    in_flight: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "t": self.t,
            **self.rates,
            **self.latency,
            "queued": self.queued,
            "in_flight": self.in_flight,
        }


def point_between(earlier: Reading, later: Reading) -> Point:
    elapsed = later.at - earlier.at
    if elapsed <= 0:
        raise ValueError(f"readings out of order: {earlier.at} then {later.at}")
    rates = {
        # A counter never goes down in one registry; clamp anyway so a chart never dips below 0.
        name: max(0.0, later.counters[name] - earlier.counters[name]) / elapsed
        for name in COUNTERS
    }
    latency: dict[str, float | None] = {}
    for histogram in HISTOGRAMS:
        observed = bucket_difference(
            later.histograms.get(histogram, ()), earlier.histograms.get(histogram, ())
        )
        for label, q in QUANTILES.items():
            latency[f"{histogram}_{label}"] = quantile(observed, q)
    return Point(later.at, rates, latency, later.queued, later.in_flight)


class History:
    """The last `capacity` points (a ring buffer). Not thread-safe: used on one asyncio loop."""

    def __init__(self, capacity: int = 300) -> None:
        self.capacity = capacity
        self._points: deque[Point] = deque(maxlen=capacity)
        self._last: Reading | None = None

    def record(self, reading: Reading) -> None:
        """Add a reading; from the second one on, each adds a point."""
        last = self._last
        if last is not None and reading.at <= last.at:
            return  # the wall clock stepped back: skip until it passes the last reading
        self._last = reading
        if last is not None:
            self._points.append(point_between(last, reading))

    def points(self, since: float | None = None) -> list[Point]:
        """The points after `since` (all when None), oldest first."""
        if since is None:
            return list(self._points)
        return [point for point in self._points if point.t > since]


class Sampler:
    """Reads a registry into a `History` every `interval_s`, in a task on the asyncio loop
    that first calls `ensure_started` (the dashboard's first request): the node runs no
    sampling for nobody. The task ends with its loop (uvicorn's shutdown cancels it)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        history: History,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.history = history
        self.interval_s = interval_s
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def ensure_started(self) -> None:
        """Start sampling if not running (call on the loop that should run it)."""
        if self._task is None or self._task.done():
            self.sample()  # the baseline, so the first point comes one interval from now
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="dispatch-ui-sampler"
            )

    def sample(self) -> None:
        self.history.record(read_registry(self.registry, self._clock()))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.sample()
            except Exception:
                # A chart with a gap beats a dashboard whose history stopped for good.
                log.exception("sampling the metrics registry failed")

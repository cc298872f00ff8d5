"""The dashboard's metric history: registry readings, rates, bucket percentiles, the ring."""

from __future__ import annotations

import asyncio
import math
from itertools import pairwise

import pytest

from dispatch.api.metrics import Metrics
from dispatch.api.ui_history import (
    Buckets,
    History,
    Reading,
    Sampler,
    point_between,
    quantile,
    read_registry,
)

INF = math.inf


def test_quantile_of_an_empty_histogram_is_none() -> None:
    assert quantile((), 0.5) is None
    assert quantile(((0.1, 0.0), (INF, 0.0)), 0.5) is None


def test_quantile_interpolates_inside_the_bucket_that_holds_it() -> None:
    # 10 observations: 4 at or below 0.1 s, 10 at or below 0.2 s.
    buckets: Buckets = ((0.1, 4.0), (0.2, 10.0), (INF, 10.0))
    assert quantile(buckets, 0.2) == pytest.approx(0.05)  # rank 2 of the 4 in [0, 0.1]
    assert quantile(buckets, 0.7) == pytest.approx(0.15)  # rank 7: 3 of the 6 in (0.1, 0.2]
    assert quantile(buckets, 1.0) == pytest.approx(0.2)


def test_quantile_in_the_infinite_bucket_is_the_largest_finite_bound() -> None:
    buckets: Buckets = ((0.1, 1.0), (0.2, 1.0), (INF, 5.0))
    assert quantile(buckets, 0.99) == 0.2


def test_quantile_skips_empty_buckets() -> None:
    buckets: Buckets = ((0.1, 0.0), (0.2, 0.0), (0.4, 2.0), (INF, 2.0))
    assert quantile(buckets, 0.5) == pytest.approx(0.3)


def test_a_reading_holds_the_counters_histograms_and_gauges_of_the_node_metrics() -> None:
    metrics = Metrics()
    metrics.completed.inc(3)
    metrics.dead.inc()
    metrics.dispatch_latency.observe(0.003)
    metrics.queue_depth.labels("image.resize", "ready").set(5)
    metrics.queue_depth.labels("image.resize", "delayed").set(2)
    metrics.queue_depth.labels("mail.send", "ready").set(1)
    metrics.in_flight.set(4)
    reading = read_registry(metrics.registry, at=100.0)
    assert reading.at == 100.0
    assert reading.counters == {
        "enqueued": 0.0, "assigned": 0.0, "completed": 3.0, "dead": 1.0, "requeued": 0.0
    }  # fmt: skip
    assert (reading.queued, reading.in_flight) == (8.0, 4.0)
    dispatch = dict(reading.histograms["dispatch"])
    assert (dispatch[0.0025], dispatch[0.005], dispatch[INF]) == (0.0, 1.0, 1.0)
    assert reading.histograms["commit"][-1] == (INF, 0.0)


def test_a_point_has_rates_and_the_percentiles_of_its_own_interval_only() -> None:
    metrics = Metrics()
    metrics.dispatch_latency.observe(20.0)  # before the interval: must not count
    metrics.completed.inc(10)
    earlier = read_registry(metrics.registry, at=100.0)
    metrics.completed.inc(6)
    metrics.enqueued.inc(2)
    for _ in range(4):
        metrics.dispatch_latency.observe(0.004)
    metrics.in_flight.set(7)
    later = read_registry(metrics.registry, at=102.0)
    point = point_between(earlier, later)
    data = point.to_dict()
    assert data["t"] == 102.0
    assert (data["completed"], data["enqueued"], data["dead"]) == (3.0, 1.0, 0.0)
    assert data["dispatch_p50"] == pytest.approx(0.00375)
    assert data["dispatch_p99"] is not None and data["dispatch_p99"] <= 0.005
    assert data["commit_p95"] is None, "no commit observed in the interval"
    assert (data["in_flight"], data["queued"]) == (7.0, 0.0)


def test_a_point_needs_readings_in_time_order() -> None:
    reading = read_registry(Metrics().registry, at=5.0)
    with pytest.raises(ValueError, match="out of order"):
        point_between(reading, reading)


def _reading(at: float, completed: float = 0.0) -> Reading:
    counters = dict.fromkeys(("enqueued", "assigned", "completed", "dead", "requeued"), 0.0)
    counters["completed"] = completed
    return Reading(at, counters, {}, 0.0, 0.0)


def test_history_keeps_the_last_points_and_answers_those_after_since() -> None:
    history = History(capacity=3)
    for second in range(6):
        history.record(_reading(float(second), completed=float(second * 2)))
    assert [point.t for point in history.points()] == [3.0, 4.0, 5.0]
    assert [point.rates["completed"] for point in history.points()] == [2.0, 2.0, 2.0]
    assert [point.t for point in history.points(since=3.0)] == [4.0, 5.0]
    assert history.points(since=5.0) == []


def test_history_ignores_a_reading_from_a_clock_that_stepped_back() -> None:
    history = History()
    history.record(_reading(10.0))
    history.record(_reading(9.0, completed=100.0))
    history.record(_reading(11.0, completed=4.0))
    assert [(point.t, point.rates["completed"]) for point in history.points()] == [(11.0, 4.0)]


def test_the_sampler_reads_the_registry_on_its_interval_once_started() -> None:
    metrics = Metrics()
    history = History()
    sampler = Sampler(metrics.registry, history, interval_s=0.02)

    async def run() -> None:
        sampler.ensure_started()
        sampler.ensure_started()  # a second request does not start a second task
        metrics.completed.inc(5)
        await asyncio.sleep(0.2)

    asyncio.run(run())
    points = history.points()
    assert len(points) >= 3
    assert sum(point.rates["completed"] for point in points) > 0
    # One task: points are evenly spaced, never two per interval.
    gaps = [later.t - earlier.t for earlier, later in pairwise(points)]
    assert min(gaps) >= 0.015

"""Mergeable per-minute latency histograms."""

from __future__ import annotations

import math
import random

import pytest

from dispatch.delta.stats import (
    BUCKET_FLOOR_S,
    GROWTH,
    MAX_BUCKET,
    Histogram,
    MinuteStats,
    StatsAccumulator,
    bucket_of,
    bucket_value,
    minute_of,
)


def test_buckets_are_log_scale_and_bounded() -> None:
    assert bucket_of(-1.0) == bucket_of(0.0) == bucket_of(BUCKET_FLOOR_S) == 0
    assert bucket_of(float("nan")) == 0
    assert bucket_of(BUCKET_FLOOR_S * 1.0001) == 1
    for bucket in (1, 2, 10, 100):
        upper = BUCKET_FLOOR_S * GROWTH**bucket
        assert bucket_of(upper) == bucket
        assert bucket_of(upper * 1.0001) == bucket + 1
    assert bucket_of(1e12) == MAX_BUCKET


@pytest.mark.parametrize("seed", range(5))
def test_percentiles_are_within_five_percent(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.lognormvariate(0, 2) for _ in range(5000)]
    histogram = Histogram()
    for value in values:
        histogram.add(value)
    ordered = sorted(values)
    for quantile in (0.5, 0.95, 0.99):
        exact = ordered[math.ceil(quantile * len(ordered)) - 1]
        estimate = histogram.percentile(quantile)
        assert estimate is not None
        assert abs(estimate - exact) / exact < 0.05


def test_merging_equals_adding_everything_to_one() -> None:
    rng = random.Random(1)
    values = [rng.expovariate(0.5) for _ in range(300)]
    whole, left, right = Histogram(), Histogram(), Histogram()
    for index, value in enumerate(values):
        whole.add(value)
        (left if index % 3 else right).add(value)
    left.merge(right)
    assert left.buckets == whole.buckets and left.count == whole.count
    assert left.total == pytest.approx(whole.total)
    assert (left.minimum, left.maximum) == (whole.minimum, whole.maximum)


def test_an_empty_histogram_has_no_percentiles() -> None:
    assert Histogram().percentile(0.5) is None
    assert Histogram().columns("x")["x_p95_s"] is None


def test_rows_round_trip_through_their_columns() -> None:
    stats = MinuteStats()
    stats.counters["submitted"] = 3
    stats.queue_wait.add(0.25)
    stats.run_time.add(2.0)
    stats.run_time.add(4.0)
    columns = stats.columns()
    assert columns["submitted"] == 3 and columns["run_time_n"] == 2
    assert columns["run_time_hist"] == sorted(columns["run_time_hist"])
    back = MinuteStats.from_columns(columns)
    assert back == stats
    # Delta map columns arrive as dicts from some readers.
    as_dict = dict(columns, run_time_hist=dict(columns["run_time_hist"]))
    assert MinuteStats.from_columns(as_dict) == stats


def test_the_accumulator_keys_by_minute_group_exec_and_client() -> None:
    accumulator = StatsAccumulator()
    assert not accumulator
    accumulator.count("submitted", 120.5, "g", "a.b", "c")
    accumulator.count("submitted", 179.9, "g", "a.b", "c")
    accumulator.queue_wait(1.0, 180.0, "g", "a.b", "c")
    assert set(accumulator.rows) == {(120, "g", "a.b", "c"), (180, "g", "a.b", "c")}
    assert accumulator.rows[(120, "g", "a.b", "c")].counters["submitted"] == 2
    assert minute_of(-0.5) == -60
    assert bucket_value(0) == BUCKET_FLOOR_S / 2

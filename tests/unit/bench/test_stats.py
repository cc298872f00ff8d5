from __future__ import annotations

from dispatch.bench.stats import machine, percentiles, steal_percent


def _ticks(steal: int, idle: int, user: int) -> dict[str, object]:
    return {"cpu_ticks": {"user": user, "nice": 0, "system": 0, "idle": idle, "iowait": 0,
                          "irq": 0, "softirq": 0, "steal": steal}}  # fmt: skip


def test_steal_is_the_share_of_cpu_time_taken_by_other_guests_between_two_readings() -> None:
    before, after = _ticks(100, 1000, 500), _ticks(160, 1100, 540)
    assert steal_percent(before, after) == 30.0  # 60 of 200 ticks


def test_steal_is_unknown_without_counters() -> None:
    assert steal_percent({}, _ticks(1, 1, 1)) is None
    assert steal_percent(_ticks(1, 1, 1), _ticks(1, 1, 1)) is None  # no time passed


def test_a_reading_of_this_machine_carries_its_counters() -> None:
    reading = machine()
    assert reading["nproc"] >= 1
    assert reading["cpu_ticks"]["idle"] > 0  # Linux: every bench runs here


def test_percentiles_are_in_milliseconds() -> None:
    assert percentiles([0.001] * 99 + [1.0]) == {"p50": 1.0, "p95": 1.0, "p99": 1000.0,
                                                 "max": 1000.0}  # fmt: skip


def test_percentiles_in_seconds_for_the_streaming_bench() -> None:
    assert percentiles([0.25, 1.5], scale=1.0, digits=3) == {"p50": 1.5, "p95": 1.5, "p99": 1.5,
                                                            "max": 1.5}  # fmt: skip

"""The streaming bench's pure parts: the leader emulator's pace at a high rate, the records a
large tick becomes, the per-window counts and the verdict on a run that fell short."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.streaming_bench import (
    PRODUCER,
    RECORD_MAX_BYTES,
    TICK_S,
    Load,
    Window,
    shortfalls,
    tick_records,
    windows_of,
)
from dispatch.core.events import Event
from dispatch.event_records import decode_batch
from dispatch.stack.broker import TOPIC_MAX_MESSAGE_BYTES

START = 1_000.0


def _per_second(rate: float, seconds: int) -> tuple[Load, Counter[tuple[str, int]]]:
    """Drive a Load tick by tick on a fake clock; (type, whole second) -> events."""
    load = Load(rate, run_s=1.0, started=START)
    load.start()
    counts: Counter[tuple[str, int]] = Counter()
    for tick in range(1, round(seconds / TICK_S) + 1):
        # Integer milliseconds: START + tick * TICK_S would put some ticks a hair before
        # their second.
        now = START + tick * 10 / 1000
        _, events = load.step(now)
        for event in events:
            counts[event.type, int(event.at - START)] += 1
    return load, counts


def test_the_emulator_assigns_and_completes_what_it_submits_at_5000_jobs_per_s() -> None:
    load, counts = _per_second(5_000, seconds=4)
    # Second 0 fills the pipeline (nothing is acked before run_s); seconds 1-3 are steady.
    for second in (1, 2, 3):
        submitted = counts["enqueued", second]
        assert submitted == pytest.approx(5_000, abs=50)
        assert counts["assigned", second] == submitted
        assert counts["completed", second] == pytest.approx(submitted, rel=0.01)
    assert load.submitted == 20_000


def test_a_late_tick_catches_up_and_reports_its_lag() -> None:
    load = Load(1_000, run_s=1.0, started=START)
    load.start()
    load.step(START + 0.01)
    requests, _ = load.step(START + 0.51)
    # Everything due by then, the oldest due half a second ago.
    assert len(requests) == 500
    assert load.lag_s == pytest.approx(0.5, abs=0.002)
    load.step(START + 0.52)
    # Back on schedule: no job waited longer than one tick.
    assert load.lag_s <= TICK_S


def test_late_ticks_are_reported_not_capped() -> None:
    # Ticks 6 s apart at 1,000 jobs/s: each acks the ~6,000 jobs the previous one assigned
    # and assigns ~6,000 more. A cap sized for run_s alone (2 x (run_s + 1) s of jobs: 4,000
    # in all) let each tick assign only 4,000, as the first 3,000 jobs/s run showed.
    load = Load(1_000, run_s=1.0, started=START)
    load.start()
    for tick in range(1, 5):
        requests, events = load.step(START + 6.0 * tick)
        kinds = Counter(event.type for event in events)
        assert kinds["assigned"] == len(requests) == 6_000
        assert kinds["completed"] == (6_000 if tick > 1 else 0)
        assert load.lag_s == pytest.approx(6.0, abs=0.01)


def _late_tick(rate: float, late_s: float) -> list[Event]:
    """The events of a tick that ran `late_s` after the previous one."""
    load = Load(rate, run_s=0.5, started=START)
    events = load.start()
    events += load.step(START + 0.01)[1]
    return events + load.step(START + 0.01 + late_s)[1]


def test_a_large_tick_becomes_several_records_each_under_the_limits() -> None:
    # 2 s behind at 10,000 jobs/s: 20,000 jobs submitted and assigned, 100 acked.
    events = _late_tick(10_000, late_s=2.0)
    records = tick_records(events)
    # One record would be far over kafka-python's default 1 MiB (what the emulator died on).
    assert sum(len(record) for record in records) > RECORD_MAX_BYTES
    assert len(records) >= 2
    assert all(len(record) <= RECORD_MAX_BYTES for record in records)
    assert RECORD_MAX_BYTES <= PRODUCER["max_request_size"] <= TOPIC_MAX_MESSAGE_BYTES
    decoded = [event for record in records for event in decode_batch(record).events]
    assert decoded == events


def test_a_tick_splits_at_any_bound_in_order() -> None:
    events = _late_tick(1_000, late_s=0.5)
    records = tick_records(events, max_bytes=16 * 1024)
    assert len(records) > 5
    assert all(len(record) <= 16 * 1024 for record in records)
    assert [e for r in records for e in decode_batch(r).events] == events


def test_windows_count_submitted_assigned_and_completed_per_second() -> None:
    seen = [
        ("enqueued", 99.9, 100.5),  # before the run
        ("enqueued", 100.0, 101.0),
        ("enqueued", 101.0, 102.0),
        ("assigned", 101.0, 103.0),
        ("completed", 109.99, 111.0),
        ("job_heartbeat", 105.0, 106.0),  # not counted, but measured
        ("enqueued", 110.0, 112.0),
        ("assigned", 110.0, None),
        ("completed", 112.0, 113.0),
        ("completed", 120.0, 121.0),
        ("enqueued", 124.9, 125.4),
        ("enqueued", 125.0, 125.5),  # after the run
    ]
    first, second, last = windows_of(seen, start=100.0, end=125.0, window_s=10.0)
    assert (first.start_s, first.length_s) == (0.0, 10.0)
    assert first.jobs == {"submitted": 2, "assigned": 1, "completed": 1}
    assert (first.submitted_per_s, first.assigned_per_s, first.completed_per_s) == (0.2, 0.1, 0.1)
    assert first.freshness_s["n"] == 5
    assert first.freshness_s["max"] == 2.0
    assert first.not_visible == 0
    assert second.jobs == {"submitted": 1, "assigned": 1, "completed": 1}
    assert second.freshness_s["n"] == 2
    assert second.not_visible == 1
    # The last window is 5 s long: its rates are per second of it.
    assert (last.start_s, last.length_s) == (20.0, 5.0)
    assert last.jobs == {"submitted": 1, "assigned": 0, "completed": 1}
    assert (last.submitted_per_s, last.completed_per_s) == (0.2, 0.2)
    assert (last.freshness_s["n"], last.freshness_s["max"]) == (2, 1.0)


def _window(submitted: float, assigned: float, completed: float, p50: float) -> Window:
    counts = {"submitted": int(submitted), "assigned": int(assigned), "completed": int(completed)}
    return Window(
        start_s=0.0,
        length_s=1.0,
        jobs=counts,
        submitted_per_s=submitted,
        assigned_per_s=assigned,
        completed_per_s=completed,
        freshness_s={"p50": p50},
        not_visible=0,
    )


def test_a_run_that_kept_up_has_no_shortfalls() -> None:
    windows = [_window(1_000, 1_000, 998, 1.2), _window(1_000, 1_000, 1_000, 1.3)]
    assert shortfalls(1_000, 1_000, 1_000, 999, windows, 0.02, 0.03, 1.0) == []


def test_the_old_cap_shows_as_a_shortfall_of_the_emulator() -> None:
    # 5 clients x 100 in flight, 1 s a job: 500 completions/s whatever was asked.
    windows = [_window(1_000, 500, 500, 1.2)]
    found = shortfalls(1_000, 1_000, 500, 500, windows, 0.02, 0.03, 1.0)
    assert found == [
        "assigned 500/s < 1000/s submitted: the emulator could not keep up "
        "(its core's cap or credit limited it)",
        "completed 500/s < 1000/s submitted: the emulator could not keep up "
        "(its core's cap or credit limited it)",
        "windows where assigned or completed/s < 95% of submitted/s: 0 s",
    ]


def test_a_slow_emulator_and_a_slow_fold_are_told_apart() -> None:
    windows = [_window(600, 600, 600, 1.0), _window(600, 600, 600, 9.0)]
    found = shortfalls(1_000, 600, 600, 600, windows, 3.5, 2.0, None)
    assert [line.split(":")[0] for line in found] == [
        "submitted 600/s < 1000/s asked",
        "the emulator could not keep up",
        "the emulator could not keep up",
        "the fold could not keep up",
        "the fold fell behind",
    ]
    assert "3.50 s after their due time" in found[1]
    assert "2.00 s (p95) to reach the broker" in found[2]
    assert "over 120 s" in found[3]
    # A fold that catches up, but slowly, is named too.
    slow = shortfalls(1_000, 1_000, 1_000, 1_000, windows[:1], 0.02, 0.03, 25.0)
    assert slow == [
        "the fold could not keep up: it needed 25 s after the emulator stopped to read the rest"
    ]

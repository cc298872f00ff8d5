"""The leader emulator of bench/streaming_bench.py: the rate asked is the rate it submits,
assigns and completes, and its records stay under the limits."""

from __future__ import annotations

from collections import Counter

import pytest

from dispatch.bench.leader_emulator import PRODUCER, RECORD_MAX_BYTES, TICK_S, Load, tick_records
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

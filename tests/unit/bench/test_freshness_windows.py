"""The freshness run's windows and its verdict on who could not keep up."""

from __future__ import annotations

from dispatch.bench.freshness_windows import Window, shortfalls, windows_of


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

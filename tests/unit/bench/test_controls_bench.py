"""The controls bench's pure parts: its statistics and its report (no stack)."""

from __future__ import annotations

from dispatch.bench.controls_bench import FIGURES, _name, cpu_used, format_report, summarize


def test_summarize_gives_milliseconds_by_nearest_rank() -> None:
    seconds = [n / 1000 for n in range(1, 101)]  # 1 ms ... 100 ms
    assert summarize(seconds) == {"n": 100, "p50": 51.0, "p95": 96.0, "max": 100.0}


def test_summarize_of_one_and_of_none() -> None:
    assert summarize([0.0123]) == {"n": 1, "p50": 12.3, "p95": 12.3, "max": 12.3}
    assert summarize([]) == {"n": 0}


def test_summarize_keeps_a_negative_overshoot() -> None:
    # A stop seen before run_limit_at (clock rounding) is a finding, not an error.
    assert summarize([-0.002, 0.004])["p50"] == 4.0
    assert summarize([-0.002])["max"] == -2.0


def test_cpu_used_is_the_difference_per_process_of_the_later_reading() -> None:
    before = {"broker": 10.0, "leader node": 2.5}
    after = {"broker": 12.25, "leader node": 3.0, "worker (ws)": 0.5}
    assert cpu_used(before, after) == {"broker": 2.25, "leader node": 0.5, "worker (ws)": 0.5}


def test_the_report_has_a_row_per_figure_and_the_cpu() -> None:
    result = {
        "seconds": 12.0,
        "worker_slots": 32,
        "parallel": 8,
        "figures": {"cancel_seen_sync": summarize([0.04, 0.05]), "progress_kept": {"n": 0}},
        "cpu_s": {"broker": 7.1, "leader node": 3.8},
        "unexpected": ["ctl-rest-forever-1: reason ended, dead time_limit"],
    }
    report = format_report({"ws": result}).splitlines()
    assert report[0] == "== ws (12 s, worker slots 32, 8 jobs at a time)"
    assert len(report) == 2 + len(FIGURES) + 2
    sync = next(line for line in report if line.startswith(FIGURES["cancel_seen_sync"]))
    assert sync.split()[-4:] == ["2", "50.0", "50.0", "50.0"]
    kept = next(line for line in report if line.startswith(FIGURES["progress_kept"]))
    assert kept.split()[-4:] == ["0", "-", "-", "-"]
    assert report[-2] == "CPU s: broker 7.10, leader node 3.80"
    assert "reason ended" in report[-1]


def test_the_api_node_is_named_the_leader() -> None:
    assert _name("api-41521") == "leader node"
    assert _name("broker") == "broker"

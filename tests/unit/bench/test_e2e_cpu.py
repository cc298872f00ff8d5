"""`dispatch bench`'s CPU per job by process: the load generator's rows, the brokers it
watches, and the text under its figures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dispatch.bench.e2e import (
    BenchResult,
    Load,
    broker_processes,
    cpu_tables,
    sdk_loop_mode,
    sdk_loop_name,
)
from dispatch.bench.process_cpu import CpuWindow
from dispatch.settings import load_settings


def _load_generator_rows(ended_s: float, report: dict[str, object]) -> list[tuple[str, float]]:
    window = CpuWindow([])
    window.start()
    window.stop()
    cpu = Load._cpu(window, ended_s, report, 1000, "64 clients, batch 1")
    return [(row.role, row.cpu_s) for row in cpu.rows if row.pid == report.get("pid")]


def test_the_load_generator_is_its_cpu_submitting_and_the_rest_of_its_life() -> None:
    assert _load_generator_rows(0.75, {"pid": 321, "cpu_s": 0.5}) == [
        ("load generator (64 clients, batch 1)", 0.5),
        ("load generator: start-up, imports, exit", 0.25),
    ]
    # Its own reading and the kernel's, taken apart, never make a negative start-up.
    assert _load_generator_rows(0.4, {"pid": 321, "cpu_s": 0.5})[1][1] == 0.0


def test_no_broker_of_ours_runs_on_a_fresh_var(tmp_path: Path) -> None:
    assert broker_processes(load_settings(paths={"var": str(tmp_path / "var")})) == []


def test_the_cpu_tables_print_under_the_figures_only_when_measured() -> None:
    fields = {field.name: None for field in dataclasses.fields(BenchResult)}
    result = BenchResult(**fields)  # type: ignore[arg-type]
    assert cpu_tables(result) == ""
    window = CpuWindow([])
    window.start()
    window.stop()
    report = window.report(100)
    text = cpu_tables(dataclasses.replace(result, cpu=report, sdk_loop_cpu=report))
    assert [line.split(":")[0] for line in text.splitlines() if line.startswith("CPU")] == [
        "CPU per job by process, measured phase",
        "CPU per job by process, SDK loop",
    ]


def test_the_sdk_loops_mode_is_sequential_threads_or_async_never_both() -> None:
    assert sdk_loop_mode() == sdk_loop_mode(1, 0) == "sequential"
    assert sdk_loop_mode(16) == "threads:16"
    assert sdk_loop_mode(1, 64) == "async:64"
    with pytest.raises(ValueError, match="not both"):
        sdk_loop_mode(16, 64)
    with pytest.raises(ValueError):
        sdk_loop_mode(0)


def test_the_sdk_loops_name_says_its_mode_except_sequential() -> None:
    # Sequential keeps the name it had before the modes: today's output, unchanged.
    assert sdk_loop_name("sequential") == sdk_loop_name(None) == "SDK loop"
    assert sdk_loop_name("threads:16") == "SDK loop, 16 threads sharing one Client"
    assert sdk_loop_name("async:64") == "SDK loop, 64 tasks on one AsyncClient"
    fields = {field.name: None for field in dataclasses.fields(BenchResult)}
    window = CpuWindow([])
    window.start()
    window.stop()
    result = BenchResult(**fields)  # type: ignore[arg-type]
    text = cpu_tables(
        dataclasses.replace(result, sdk_loop_cpu=window.report(10), sdk_loop_mode="async:64")
    )
    assert text.startswith("CPU per job by process, SDK loop, 64 tasks on one AsyncClient: 10 jobs")

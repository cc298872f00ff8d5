"""The JVM start-up benchmark's own logic: every variant of every target measured each round
in its own process with its settings in the environment, and the medians printed. (The
measurements start real JVMs: BENCHMARKS.md has a run.)"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from dispatch.bench import jvm_start_bench


def test_each_variant_runs_in_a_process_with_its_settings_and_the_medians_print(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[str, str, str]] = []
    starts = iter(range(1, 100))

    def fake_run(
        command: list[str], env: dict[str, str], **_: Any
    ) -> subprocess.CompletedProcess[str]:
        variant = (
            f"sharing={env['DISPATCH_JVM__CLASS_SHARING']} quick={env['DISPATCH_JVM__QUICK_START']}"
        )
        seen.append((command[-1], variant, command[-2]))
        return subprocess.CompletedProcess(
            command, 0, f'{{"start_s": {next(starts)}, "work_s": 1.0}}\n', ""
        )

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert jvm_start_bench.main(["--rounds", "3", "--targets", "broker"]) == 0
    assert len(seen) == 3 * len(jvm_start_bench.VARIANTS)
    assert {target for target, _, flag in seen} == {"broker"} and {flag for *_, flag in seen} == {
        "--one"
    }
    assert len({variant for _, variant, _ in seen}) == 4
    table = capsys.readouterr().out.splitlines()
    # Round r measures "neither" with start 4(r-1)+1: starts 1, 5, 9, median 5; "both" 4, 8, 12.
    assert table[1].split() == ["broker", "neither", "5.0", "1.0", "6.0"]
    assert table[4].split() == ["broker", "both", "8.0", "1.0", "9.0"]


def test_a_failed_measurement_says_which(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "no archive")

    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(RuntimeError, match="spark / neither failed"):
        jvm_start_bench.run_one("spark", "neither")

"""Pid files that survive crashes: real short-lived processes, started and stopped by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dispatch.stack.process import ManagedProcess, ProcessError, is_running, start_ticks

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_start_records_pid_and_stop_ends_the_process(tmp_path: Path) -> None:
    process = ManagedProcess("sleeper", tmp_path, tmp_path / "sleeper.log")
    record = process.start(SLEEPER)
    try:
        assert is_running(record.pid, record.ticks)
        assert process.record() == record
    finally:
        assert process.stop(timeout_s=5.0)
    assert not is_running(record.pid)
    assert not process.pid_file.exists()
    assert process.record() is None


def test_a_second_start_is_refused_while_running(tmp_path: Path) -> None:
    process = ManagedProcess("sleeper", tmp_path, tmp_path / "sleeper.log")
    record = process.start(SLEEPER)
    try:
        with pytest.raises(ProcessError, match=f"already running \\(pid {record.pid}\\)"):
            process.start(SLEEPER)
    finally:
        process.stop(timeout_s=5.0)


def test_a_stale_pid_file_from_a_crash_is_detected_and_removed(tmp_path: Path) -> None:
    crashed = subprocess.Popen([sys.executable, "-c", "pass"])
    crashed.wait()
    process = ManagedProcess("broker", tmp_path, tmp_path / "broker.log")
    process.pid_file.write_text(json.dumps({"pid": crashed.pid, "ticks": 1, "argv": ["java"]}))
    assert process.record() is None
    assert not process.pid_file.exists()
    assert process.stop() is False


def test_a_reused_pid_is_not_mistaken_for_ours(tmp_path: Path) -> None:
    # A live process whose start time differs from the recorded one: the pid was reused.
    stranger = subprocess.Popen(SLEEPER)
    try:
        ticks = start_ticks(stranger.pid)
        assert ticks is not None
        process = ManagedProcess("broker", tmp_path, tmp_path / "broker.log")
        process.pid_file.write_text(
            json.dumps({"pid": stranger.pid, "ticks": ticks - 1, "argv": []})
        )
        assert process.record() is None
        assert process.stop() is False
        assert stranger.poll() is None, "a stranger's process was signalled"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_process_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    ignore_sigterm = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    stubborn = [sys.executable, "-c", ignore_sigterm]
    process = ManagedProcess("stubborn", tmp_path, tmp_path / "stubborn.log")
    record = process.start(stubborn)
    while "ready" not in process.log_tail():
        pass
    assert process.stop(timeout_s=0.5)
    assert not is_running(record.pid, record.ticks)


def test_an_unreadable_pid_file_is_an_error_naming_it(tmp_path: Path) -> None:
    process = ManagedProcess("broker", tmp_path, tmp_path / "broker.log")
    process.pid_file.write_text("not json")
    with pytest.raises(ProcessError, match=r"broker\.pid"):
        process.record()


def test_a_start_right_after_a_kill_reaps_the_killed_process(tmp_path: Path) -> None:
    # The chaos run's fold restart: kill -9, then start again as soon as the pid no longer
    # runs. The killed child must be waited for, not dropped (Python warns it "is still
    # running" when such a Popen is collected, and the zombie stays).
    process = ManagedProcess("sleeper", tmp_path, tmp_path / "sleeper.log")
    first = process.start(SLEEPER)
    killed = process._child
    os.kill(first.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_running(first.pid, first.ticks) and time.monotonic() < deadline:
        time.sleep(0.01)
    process.start(SLEEPER)
    try:
        assert killed is not None and killed.returncode == -signal.SIGKILL
    finally:
        assert process.stop(timeout_s=5)

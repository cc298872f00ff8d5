"""The fault benchmarks' harness without a stack: the waits, kill -9 by pid file, the settings."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch.bench.harness import (
    kill_9,
    kill_9_if_running,
    poll_until,
    running_record,
    stack_settings,
)
from dispatch.stack.process import ManagedProcess


def test_poll_until_returns_what_the_probe_found_once_it_found_something() -> None:
    answers = iter([None, None, 7])
    assert poll_until("seven", lambda: next(answers), timeout_s=5, poll_s=0.001) == 7


def test_poll_until_names_what_never_came() -> None:
    with pytest.raises(RuntimeError, match="no completed job within 0 s"):
        poll_until("completed job", lambda: None, timeout_s=0.05, poll_s=0.01)


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[ManagedProcess]:
    process = ManagedProcess("sleeper", tmp_path / "run", tmp_path / "sleeper.log")
    process.start([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.stop(timeout_s=5.0)  # by its pid file, should a test fail before its kill


def test_kill_9_kills_by_the_pid_file_and_reaps(sleeper: ManagedProcess) -> None:
    record = running_record(sleeper)
    assert kill_9(sleeper) == record
    assert sleeper.exit_code() == -signal.SIGKILL  # reaped: its code is known
    assert sleeper.record() is None


def test_a_fault_with_nothing_to_kill_is_an_error_but_a_teardown_goes_on(
    sleeper: ManagedProcess,
) -> None:
    kill_9(sleeper)
    with pytest.raises(RuntimeError, match="sleeper is not running"):
        kill_9(sleeper)
    kill_9_if_running(sleeper)  # nothing to do, no error


def test_the_stack_settings_put_everything_under_the_scratch_folder(tmp_path: Path) -> None:
    single = stack_settings(tmp_path)
    assert single.paths.var == tmp_path / "var"
    assert single.kafka.brokers == 1
    assert len(set(single.api.ports)) == 2
    assert single.dispatcher.default_cap == 1_000_000
    cluster = stack_settings(tmp_path, brokers=3)
    assert cluster.kafka.brokers == 3
    assert cluster.kafka.start_timeout_s == 180.0

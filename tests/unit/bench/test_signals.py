"""A benchmark killed with SIGTERM unwinds: its `finally` blocks (which stop the brokers and
drivers it started) run, and it exits with the code a shell expects for SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from dispatch.bench.signals import EXIT_CODE, sigterm_unwinds, unwinds_on_sigterm

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = """
import os, signal, sys, time
from dispatch.bench.signals import sigterm_unwinds
with sigterm_unwinds():
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        print("slept through it")
    finally:
        print("stopped what it started", flush=True)
"""


def test_sigterm_runs_the_finally_blocks_and_exits_143() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == EXIT_CODE == 143
    assert done.stdout.splitlines() == ["stopped what it started"]


def test_a_decorated_function_unwinds_and_the_previous_handler_comes_back() -> None:
    seen: list[object] = []

    @unwinds_on_sigterm
    def main() -> int:
        seen.append(signal.getsignal(signal.SIGTERM))
        return 7

    before = signal.getsignal(signal.SIGTERM)
    assert main() == 7
    assert seen != [before]
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_previous_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_unwinds():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before

"""`dispatch demo`, the README's first command, as a newcomer runs it: a real process that
brings up its own stack, runs the tour, exits 0 and leaves no process behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.leftovers import processes_mentioning

pytestmark = pytest.mark.integration

DISPATCH = str(Path(sys.executable).parent / "dispatch")


@pytest.mark.timeout(600)
def test_the_demo_runs_to_the_end_and_leaves_nothing_running(tmp_path: Path) -> None:
    var = tmp_path / "var"
    environment = {**os.environ, "DISPATCH_PATHS__VAR": str(var), "COLUMNS": "200"}
    demo = subprocess.run(
        [DISPATCH, "demo"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    output = demo.stdout + demo.stderr
    assert demo.returncode == 0, output
    assert "dup-1 submitted again: answered with the existing job (True)" in output
    assert "the standby leads after" in output
    assert "slow-1 took 2 attempts" in output
    assert "dead-letter queue: [('doomed-1'" in output
    assert "rejected records: 1" in output
    assert processes_mentioning(var) == [], "the demo left processes behind"

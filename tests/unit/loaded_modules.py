"""What a fresh interpreter has imported after a few lines: the cost every `dispatch` process
pays before it does anything (tests/unit/test_cli.py, tests/unit/stack/test_plan.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def modules_loaded_by(script: str, environment: Mapping[str, str] | None = None) -> set[str]:
    """The modules imported once `script` ran in a new interpreter. From the project root,
    whose packages the script imports first; a fresh process, because this one has imported
    most of the project already."""
    done = subprocess.run(
        [sys.executable, "-c", f"{script}\nimport sys; print(*sorted(sys.modules))"],
        cwd=ROOT,
        env=dict(environment) if environment is not None else None,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(done.stdout.split())

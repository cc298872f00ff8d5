"""What a test's processes left behind, found by the folder they were given."""

from __future__ import annotations

import os
from pathlib import Path

from dispatch.stack.process import is_running


def processes_mentioning(folder: Path) -> list[int]:
    """Live pids whose command line or environment names `folder`: every process the stack
    starts gets its settings (DISPATCH_PATHS__VAR under `folder`) or its data path."""
    needle = str(folder).encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if (
                needle in (proc / "cmdline").read_bytes()
                or needle in (proc / "environ").read_bytes()
            ):
                found.append(int(proc.name))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return [pid for pid in found if is_running(pid)]

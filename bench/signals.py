"""A benchmark stopped with SIGTERM (`kill PID`, a CI step's timeout) must stop what it started,
as one stopped with Ctrl-C does. Python's default SIGTERM ends the process on the spot,
skipping every `finally`: the broker, the Spark driver or the stack a benchmark started kept
running after it (seen with `dispatch.bench.streaming_bench`)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

EXIT_CODE = 128 + signal.SIGTERM
"""What a shell reports for a process killed by SIGTERM."""


def _exit(_signum: int, _frame: FrameType | None) -> NoReturn:
    raise SystemExit(EXIT_CODE)


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Inside the `with`, SIGTERM raises SystemExit, so the `finally` blocks and context
    managers that stop the benchmark's processes run. Only the main thread can set a signal
    handler; elsewhere (a benchmark run from a thread) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def unwinds_on_sigterm(function: Callable[P, R]) -> Callable[P, R]:
    """`function` runs inside `sigterm_unwinds` (for a benchmark's `main` or run function)."""

    @functools.wraps(function)
    def unwinding(*args: P.args, **kwargs: P.kwargs) -> R:
        with sigterm_unwinds():
            return function(*args, **kwargs)

    return unwinding


def terminate(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """Stop a child this benchmark started, by its pid: SIGTERM, then SIGKILL after
    `grace_s`; reaped either way (nothing when it has already ended)."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait()

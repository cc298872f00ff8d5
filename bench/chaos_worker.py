"""The worker app of the chaos run (`dispatch.bench.chaos`): `dispatch worker --app
dispatch.bench.chaos_worker:app`.

Every attempt a handler runs is written down on the worker's side, one JSON line per start and
per end, in `$CHAOS_RECORD_DIR/runs-<pid>.jsonl` (appended and flushed line by line, so a
`kill -9` loses at most the line being written). The chaos run counts from these what the
leader's log cannot show: a job run to success twice, and a worker running more jobs at once
than its declared slots (`$CHAOS_SLOTS`, also given as `--concurrency`).

- `chaos.ok`: sleeps `payload.ms` (default 20) and succeeds.
- `chaos.flaky`: fails retryably on attempt 1, succeeds on the next.
- `chaos.fail`: fails permanently: dead-lettered at once.
- `chaos.stall`: sleeps `payload.s` without heartbeats, so a job whose `timeout_s` is shorter
  times out, is retried and dead-letters; its late end is recorded as `late`, not `ok`.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from dispatch.worker.jobs import Assignment, PermanentError, Retry
from dispatch.worker.sdk import WorkerApp

RECORD_DIR_VARIABLE = "CHAOS_RECORD_DIR"
SLOTS_VARIABLE = "CHAOS_SLOTS"

app = WorkerApp("chaos", concurrency=int(os.environ.get(SLOTS_VARIABLE, "4")))


class RunBook:
    """Start and end lines of this process's attempts; `running` is what it holds now."""

    def __init__(self, directory: Path | None, slots: int) -> None:
        self.slots = slots
        self.running: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self._file = (directory / f"runs-{os.getpid()}.jsonl").open("a", buffering=1)

    def _write(self, line: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
            self._file.flush()

    def start(self, job: Assignment) -> None:
        with self._lock:
            self.running.add((job.id, job.attempt))
            self._write(
                {"e": "start", "id": job.id, "attempt": job.attempt, "worker": job.worker_id,
                 "pid": os.getpid(), "t": time.time(), "running": len(self.running),
                 "slots": self.slots}
            )  # fmt: skip

    def end(self, job: Assignment, outcome: str) -> None:
        with self._lock:
            self.running.discard((job.id, job.attempt))
            self._write(
                {"e": "end", "id": job.id, "attempt": job.attempt, "worker": job.worker_id,
                 "pid": os.getpid(), "t": time.time(), "outcome": outcome}
            )  # fmt: skip


def _book() -> RunBook:
    directory = os.environ.get(RECORD_DIR_VARIABLE)
    return RunBook(Path(directory) if directory else None, app.concurrency)


BOOK = _book()


def _number(payload: Any, name: str, default: float) -> float:
    if isinstance(payload, dict) and isinstance(payload.get(name), int | float):
        return float(payload[name])
    return default


@app.handler("chaos.ok")
async def ok(job: Assignment) -> dict[str, Any]:
    BOOK.start(job)
    try:
        await asyncio.sleep(_number(job.payload, "ms", 20.0) / 1000)
    except BaseException:
        BOOK.end(job, "aborted")
        raise
    BOOK.end(job, "ok")
    return {"attempt": job.attempt}


@app.handler("chaos.flaky")
async def flaky(job: Assignment) -> dict[str, Any]:
    BOOK.start(job)
    if job.attempt == 1:
        BOOK.end(job, "retry")
        raise Retry("chaos.flaky fails its first attempt on purpose")
    BOOK.end(job, "ok")
    return {"attempt": job.attempt}


@app.handler("chaos.fail")
async def fail(job: Assignment) -> None:
    BOOK.start(job)
    BOOK.end(job, "permanent")
    raise PermanentError("chaos.fail always fails")


@app.handler("chaos.stall", heartbeat=False)
async def stall(job: Assignment) -> dict[str, Any]:
    BOOK.start(job)
    try:
        await asyncio.sleep(_number(job.payload, "s", 3.0))
    except BaseException:
        BOOK.end(job, "aborted")
        raise
    BOOK.end(job, "late")
    return {"late": True}

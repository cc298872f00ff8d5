"""A small worker app for demos and tries: `dispatch worker --app dispatch.worker.examples:app`.

- `demo.echo`: returns its payload.
- `demo.sleep`: sleeps `payload.seconds` (default 1), heartbeating, and returns them.
- `demo.fail`: fails permanently (`payload.reason`): the job is dead-lettered at once.
- `demo.flaky`: fails retryably on its first attempt, succeeds on the next.
- `demo.stall`: sleeps `payload.seconds` (default 60) *without* heartbeats, so a job with a
  shorter `timeout_s` times out, is retried, and ends in the dead-letter queue.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dispatch.worker.jobs import Assignment, PermanentError, Retry
from dispatch.worker.sdk import WorkerApp

app = WorkerApp("demo", concurrency=4)


def _seconds(payload: Any, default: float) -> float:
    if isinstance(payload, dict) and "seconds" in payload:
        try:
            seconds = float(payload["seconds"])
        except (TypeError, ValueError):
            raise PermanentError(f"payload.seconds: expected a number, got {payload!r}") from None
        if seconds < 0:
            raise PermanentError(f"payload.seconds: expected >= 0, got {seconds}")
        return seconds
    return default


@app.handler("demo.echo")
def echo(job: Assignment) -> Any:
    return job.payload


@app.handler("demo.sleep")
async def sleep(job: Assignment) -> dict[str, float]:
    seconds = _seconds(job.payload, 1.0)
    await asyncio.sleep(seconds)
    return {"slept": seconds}


@app.handler("demo.fail")
def fail(job: Assignment) -> None:
    detail = job.payload.get("reason") if isinstance(job.payload, dict) else None
    raise PermanentError(str(detail or "demo.fail always fails"))


@app.handler("demo.flaky")
def flaky(job: Assignment) -> dict[str, int]:
    if job.attempt == 1:
        raise Retry("demo.flaky fails its first attempt on purpose")
    return {"attempt": job.attempt}


@app.handler("demo.stall", heartbeat=False)
async def stall(job: Assignment) -> dict[str, float]:
    seconds = _seconds(job.payload, 60.0)
    await asyncio.sleep(seconds)
    return {"stalled": seconds}

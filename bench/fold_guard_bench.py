"""What the fold's poison-record checks cost: the writer's plan steps on one batch, no I/O.

    .venv/bin/python -m dispatch.bench.fold_guard_bench                 # 5,000 jobs, best of 25
    .venv/bin/python -m dispatch.bench.fold_guard_bench --jobs 20000 --repeat 9

One batch as the leader logs it: N jobs submitted, assigned and completed (3 events a job, in
records of at most 256 KiB). Each step of `BatchWriter._plan` is timed alone, best of
`--repeat` runs (the best is the least disturbed by other processes on a shared machine):
`decode` (records -> events), `screen` (`dispatch.streaming.guard.event_problem` on every event: the
check this costs), `fence`, `fold`. The screen's share of the plan is the overhead; the
batch's Delta commits (hundreds of milliseconds, BENCHMARKS.md) are not included.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from collections.abc import Callable

from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Assigned, Event
from dispatch.event_records import encode_batches
from dispatch.streaming.decode import KafkaRow, decode_events, screen_events
from dispatch.streaming.fold import fence_batch, fold_batch


def batch_records(jobs: int) -> tuple[list[KafkaRow], int]:
    core = Dispatcher(
        CoreConfig(
            ack_timeout_s=600.0, max_ack_timeout_s=600.0, worker_expiry_s=None, default_cap=jobs
        )
    )
    now = 1_790_000_000.0
    events: list[Event] = core.begin_epoch(1, now) + core.join("w", ["job.assign.>"], now)
    for n in range(jobs):
        request = SubmitRequest(
            id=f"job-{n}", exec="image.resize", payload={"n": n, "tags": ["a", "b"]}, client_id="c"
        )
        events += core.submit(request, now + n * 1e-3)
    events += core.grant_credit("w", jobs, now + 10)
    for event in list(events):
        if isinstance(event, Assigned):
            events += core.ack(event.job_id, event.attempt, event.lease, now + 20, result="ok")
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    values = encode_batches("default", 1, events, 256 * 1024)
    rows = [KafkaRow("ev", 0, i, b"default", value, when) for i, value in enumerate(values)]
    return rows, len(events)


def best_ms(step: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=25)
    args = parser.parse_args(argv)
    rows, count = batch_records(args.jobs)
    logged, _ = decode_events(rows)
    kept, _ = screen_events(logged)
    admitted, _ = fence_batch(kept, {})
    steps = {
        "decode": best_ms(lambda: decode_events(rows), args.repeat),
        "screen": best_ms(lambda: screen_events(logged), args.repeat),
        "fence": best_ms(lambda: fence_batch(kept, {}), args.repeat),
        "fold": best_ms(lambda: fold_batch(kept, admitted, {}), args.repeat),
    }
    total = sum(steps.values())
    print(f"{args.jobs} jobs, {count} events, {len(rows)} records (best of {args.repeat}):")
    for name, ms in steps.items():
        print(f"  {name:<7} {ms:8.1f} ms  {ms / total:6.1%}")
    overhead = steps["screen"] / (total - steps["screen"])
    print(f"  plan    {total:8.1f} ms  (the screen adds {overhead:.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

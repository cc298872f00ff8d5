"""How fast one process replays a recorded history (`dispatch replay`).

    .venv/bin/python -m dispatch.bench.replay_bench                  # ~1M recorded events
    .venv/bin/python -m dispatch.bench.replay_bench --events 100000  # a smaller run
    .venv/bin/python -m dispatch.bench.replay_bench --delta     # also write and read Delta `events`
    .venv/bin/python -m dispatch.bench.replay_bench --json

The synthetic history: jobs of 8 execs from 20 tenants arriving at ~80 % of a 50-worker
fleet's capacity (4 slots each), run times drawn per exec, 2 % retried failures and 0.5 %
attempts that stall past their deadline, recorded by the pure core driven by the replay's own
fleet model (~4.3 events a job: enqueued, assigned, completed, credit). It is then replayed
with another policy (a cap on the largest tenant) and the phases are timed:

- read (with `--delta`): the window read back from a Delta `events` table in the fold's
  schema (delta-rs, DataFusion) and decoded into core events;
- history: the events folded into jobs, attempts and workers (`recorded_history`);
- simulate: the virtual-clock replay through the core (`simulate`);
- report: both sides' figures per exec and tenant (`compare`).

The figure is recorded events replayed per second, end to end (CPU time of this process,
`time.process_time()`: the replay never waits on anything, and CPU time is what other work on
a shared machine inflates least).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dispatch.core.events import Event
from dispatch.replay.fleet import uniform_fleet
from dispatch.replay.history import recorded_history
from dispatch.replay.model import Attempt, Outcome, RecordedJob
from dispatch.replay.overrides import apply_overrides
from dispatch.replay.report import compare
from dispatch.replay.simulation import simulate
from dispatch.settings import DispatcherSettings

T0 = 1_767_225_600.0
EXECS = 8
CLIENTS = 20
WORKERS = 50
SLOTS = 4
EVENTS_PER_JOB = 4.3
SETTINGS = DispatcherSettings(ack_timeout_s=30.0, max_ack_timeout_s=600.0)

Result = TypeVar("Result")


def synthetic_jobs(events: int, seed: int) -> list[RecordedJob]:
    """Jobs whose recording holds about `events` events."""
    rng = random.Random(seed)
    mean_run_s = [0.2 * (1 + index) for index in range(EXECS)]
    capacity_per_s = WORKERS * SLOTS / (sum(mean_run_s) / EXECS)
    gap_s = 1 / (0.8 * capacity_per_s)
    jobs: list[RecordedJob] = []
    at = T0
    for number in range(int(events / EVENTS_PER_JOB)):
        at += rng.expovariate(1 / gap_s)
        kind = rng.randrange(EXECS)
        # Tenants by a skewed draw: the first few submit most of the work.
        client = f"tenant-{min(int(rng.paretovariate(1.2)) - 1, CLIENTS - 1):02d}"
        run_s = rng.expovariate(1 / mean_run_s[kind])
        draw = rng.random()
        if draw < 0.02:
            attempts: tuple[Attempt, ...] = (
                Attempt(run_s / 2, Outcome.FAILED),
                Attempt(run_s, Outcome.COMPLETED),
            )
        elif draw < 0.025:
            attempts = (Attempt(45.0, Outcome.STALLED), Attempt(run_s, Outcome.COMPLETED))
        else:
            attempts = (Attempt(run_s, Outcome.COMPLETED),)
        jobs.append(
            RecordedJob(
                f"job-{number}",
                client,
                f"exec.kind{kind}",
                at,
                0,
                SETTINGS.max_attempts,
                SETTINGS.ack_timeout_s,
                None,
                attempts,
            )
        )
    return jobs


def timed(work: Callable[[], Result]) -> tuple[Result, float]:
    started = time.process_time()
    result = work()
    return result, time.process_time() - started


def write_and_read_delta(events: list[Event], folder: Path) -> tuple[list[Event], float, float]:
    """The events written as the fold writes them (in batches of 50k rows), then read back
    as `dispatch replay` reads them; returns (events read, write s, read s)."""
    from dispatch.replay.source import read_events
    from dispatch.warehouse import Warehouse
    from tests.unit.replay.recording import write_events_table

    warehouse = Warehouse.at(folder / "delta")
    _, write_s = timed(lambda: write_events_table(warehouse, events, batch_rows=50_000))
    read, read_s = timed(lambda: read_events(warehouse, group="default"))
    return read, write_s, read_s


def run(events_wanted: int, seed: int, delta: bool) -> dict[str, Any]:
    jobs = synthetic_jobs(events_wanted, seed)
    fleet = uniform_fleet(WORKERS, SLOTS)
    recorded_policy = apply_overrides(SETTINGS, [])
    recording = list(
        simulate(jobs, fleet, recorded_policy, recorded_under=SETTINGS, seed=seed).events
    )
    figures: dict[str, Any] = {"recorded_events": len(recording), "jobs": len(jobs)}
    if delta:
        with tempfile.TemporaryDirectory(prefix="replay-bench-") as folder:
            recording, write_s, read_s = write_and_read_delta(recording, Path(folder))
        figures["delta_write_s"] = round(write_s, 2)
        figures["read_s"] = round(read_s, 2)
    history, history_s = timed(lambda: recorded_history(recording))
    policy = apply_overrides(SETTINGS, ["dispatcher.caps.tenant-00=40"])
    replayed, simulate_s = timed(
        lambda: simulate(
            history.jobs,
            fleet,
            policy,
            recorded_under=SETTINGS,
            seed=seed,
            iterations=history.instants,
        )
    )
    groups, report_s = timed(lambda: compare(history.events, replayed.events, history.reported))
    total_s = history_s + simulate_s + report_s + figures.get("read_s", 0.0)
    figures.update(
        simulated_events=len(replayed.events),
        groups=len(groups),
        history_s=round(history_s, 2),
        simulate_s=round(simulate_s, 2),
        report_s=round(report_s, 2),
        total_s=round(total_s, 2),
        events_per_s=round(len(recording) / total_s),
        simulated_span_h=round((recording[-1].at - recording[0].at) / 3600, 2),
        max_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="recorded events wanted")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--delta", action="store_true", help="include the Delta read")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    figures = run(args.events, args.seed, args.delta)
    if args.json:
        print(json.dumps(figures))
        return 0
    print(
        f"recorded: {figures['recorded_events']:,} events, {figures['jobs']:,} jobs, "
        f"{figures['simulated_span_h']} h of virtual time"
    )
    if "read_s" in figures:
        print(
            f"delta:    written in {figures['delta_write_s']} s (not counted), "
            f"read in {figures['read_s']} s"
        )
    print(
        f"replay:   history {figures['history_s']} s, simulate {figures['simulate_s']} s, "
        f"report {figures['report_s']} s; {figures['simulated_events']:,} events simulated"
    )
    print(
        f"=> {figures['events_per_s']:,} recorded events/s replayed by one process "
        f"({figures['total_s']} s CPU, max RSS {figures['max_rss_mb']} MB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

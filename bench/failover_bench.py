"""Failover benchmark: `kill -9` the leader under load, time until the standby serves.

    .venv/bin/python -m dispatch.bench.failover_bench                   # 10 kills, then the rebuild
    .venv/bin/python -m dispatch.bench.failover_bench --kills 10 --skip-rebuild --out out.json
    .venv/bin/python -m dispatch.bench.failover_bench --skip-failover  # = python -m
    dispatch.bench.rebuild_bench

**Failover.** A real local stack (`LocalStack`, `StackPlan(streaming=True, workers=0)`) in a
temporary folder on free ports: the broker, the streaming fold and two `dispatch serve`
processes sharing the lease table. The load: one submitter thread, the SDK's `Client` with
both node URLs, `--rate` jobs/s in batches every 100 ms; `--workers` REST worker threads
(`dispatch.bench.harness_load.AckingWorkers`) that long-poll, ack every assignment at once,
and move to the other node when one does not answer (as `tests/integration/api/processes.Workers`
does), each noting when it received each assignment and the epoch of its lease token
("{epoch}.{n}").

Before the first round the load runs until the streaming fold has committed its first batch
(so every failover rebuilds from a snapshot, as in steady operation), then `--warmup` s more.
Each round: the leader is the node whose `/readyz` answers 200 (its body has the epoch); its
process gets SIGKILL; the standby's `/readyz` is polled every 20 ms until 200. Measured from
the kill: the new leader's `/readyz` 200, and the first assignment a worker received whose
lease epoch is the new leader's. From the new leader's log: when it took the lease, and its
own rebuild time and source. Then the killed node is started again (it becomes the standby),
and once it answers `/healthz` the load runs `--settle` seconds before the next round.

At the end the submitter stops, and the log is replayed into an empty core until every
accepted job is `succeeded` there (jobs the dead leader assigned but never delivered wait for
their ack deadline, `ack_timeout_s` 30 s, first); completions per job are counted in the log.

`dispatcher.default_cap` is raised to 1,000,000 (as `dispatch bench` does): after a kill, the
jobs the dead leader assigned but never delivered count as in flight until their deadline,
and the one client of the load would otherwise hit the cap of 100 and measure the cap, not
the failover.

**Rebuild.** See `dispatch.bench.rebuild_bench` (run after the failover unless `--skip-rebuild`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from dispatch.bench.harness import (
    find_leader,
    kill_9,
    poll_until,
    restart_node,
    scratch_stack,
    wait_ready,
)
from dispatch.bench.harness_load import (
    AckingWorkers,
    LoadThreads,
    Outcome,
    first_receipt,
    wait_all_succeeded,
)
from dispatch.bench.signals import unwinds_on_sigterm
from dispatch.bench.stats import p50_max
from dispatch.settings import Settings
from dispatch.stack.local import LocalStack
from dispatch.warehouse import Warehouse

EXEC = "bench.noop"
BATCH_EVERY_S = 0.1


# --- the new leader's log ------------------------------------------------------------------------


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass(frozen=True, slots=True)
class TermLog:
    """What a node's log says about the start of its term of `epoch`."""

    lease_taken_at: float | None
    """Unix time of "took the lease ... epoch N" (the log's local-time stamp)."""
    rebuild_s: float | None
    rebuilt_from: str | None
    replayed_batches: int | None


def _log_time(line: str) -> float | None:
    matched = _LOG_TIME.match(line)
    if matched is None:
        return None
    stamp = dt.datetime.strptime(matched.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()  # naive: local time, as `logging` wrote it


def term_log(text: str, epoch: int) -> TermLog:
    """Parse the election's "took the lease" line and the leader's "rebuilt from" line of
    the term whose epoch is `epoch` (dispatch.api.election, dispatch.api.leader)."""
    taken_at: float | None = None
    rebuilt = re.compile(
        rf"epoch {epoch}, rebuilt from (.+) \+ (\d+) batches of the log in ([\d.]+)s$"
    )
    rebuild: re.Match[str] | None = None
    for line in text.splitlines():
        if "took the lease of " in line and line.endswith(f", epoch {epoch}"):
            taken_at = _log_time(line)
        found = rebuilt.search(line)
        if found is not None:
            rebuild = found
    return TermLog(
        lease_taken_at=taken_at,
        rebuild_s=float(rebuild.group(3)) if rebuild else None,
        rebuilt_from=rebuild.group(1) if rebuild else None,
        replayed_batches=int(rebuild.group(2)) if rebuild else None,
    )


# --- the load ------------------------------------------------------------------------------------


class Submitter(LoadThreads):
    """`rate` jobs/s through the SDK's `Client` (both nodes), in a batch every 100 ms."""

    join_s = 60.0

    def __init__(self, urls: Sequence[str], key: str, rate: float) -> None:
        super().__init__()
        self.urls, self.key, self.rate = list(urls), key, rate
        self.accepted: list[str] = []
        self.failed_batches = 0
        self.thread = self.add_thread(self._run, "submitter")

    def _run(self) -> None:
        from dispatch.client import Client, DispatchError

        per_batch = max(1, round(self.rate * BATCH_EVERY_S))
        started = time.monotonic()
        batch = 0
        with Client(self.urls, api_key=self.key, retry_timeout_s=30.0) as client:
            while not self.stop.is_set():
                jobs = [
                    {"id": f"fo-{batch}-{n}", "exec": EXEC, "payload": {"n": n}}
                    for n in range(per_batch)
                ]
                try:
                    answers = client.submit_many(jobs, batch_size=per_batch)
                    self.accepted += [answer.id for answer in answers]
                except DispatchError:
                    self.failed_batches += 1
                batch += 1
                # Open loop: batch k leaves at k * 100 ms (a late one is caught up at once).
                self.stop.wait(max(0.0, started + batch * BATCH_EVERY_S - time.monotonic()))


# --- the fold ------------------------------------------------------------------------------------


def wait_for_first_snapshot(settings: Settings, timeout_s: float = 300.0) -> float:
    """Until the streaming fold committed its first batch (a failover then rebuilds from a
    snapshot, as in steady operation); returns the seconds waited."""
    from dispatch.delta import tables as t
    from dispatch.delta.progress import latest_progress

    started = time.monotonic()
    warehouse = Warehouse.of(settings)
    poll_until(
        "commit of the streaming fold", lambda: latest_progress(warehouse, t.JOBS), timeout_s, 1.0
    )
    return time.monotonic() - started


# --- one round -----------------------------------------------------------------------------------


@dataclass
class Round:
    killed: str
    new_leader: str
    old_epoch: int
    new_epoch: int
    kill_to_ready_s: float
    kill_to_first_assignment_s: float
    kill_to_lease_taken_s: float | None
    """From the new leader's log (millisecond stamps, the same clock as the kill's)."""
    leader_rebuild_s: float | None
    """`Leader.rebuild_s` of the new term, from its log line."""
    rebuilt_from: str | None
    replayed_batches: int | None
    restart_to_healthz_s: float


def failover_round(
    http: httpx.Client, stack: LocalStack, workers: AckingWorkers, settle_s: float
) -> Round:
    leader, old_epoch = find_leader(http, stack.nodes)
    standby = next(node for node in stack.nodes if node is not leader)
    killed_wall = time.time()
    killed_at = time.monotonic()
    kill_9(leader.process)
    ready_at, new_epoch = wait_ready(http, standby, timeout_s=60)
    first = poll_until(
        f"assignment of epoch {new_epoch}",
        lambda: first_receipt(workers.snapshot(), after=killed_at, epoch=new_epoch),
        timeout_s=60,
    )
    term = term_log(standby.process.log_file.read_text(errors="replace"), new_epoch)
    restart_s = restart_node(leader)
    time.sleep(settle_s)
    return Round(
        killed=leader.url,
        new_leader=standby.url,
        old_epoch=old_epoch,
        new_epoch=new_epoch,
        kill_to_ready_s=round(ready_at - killed_at, 3),
        kill_to_first_assignment_s=round(first.at - killed_at, 3),
        kill_to_lease_taken_s=(
            round(term.lease_taken_at - killed_wall, 3) if term.lease_taken_at else None
        ),
        leader_rebuild_s=term.rebuild_s,
        rebuilt_from=term.rebuilt_from,
        replayed_batches=term.replayed_batches,
        restart_to_healthz_s=round(restart_s, 2),
    )


# --- the run -------------------------------------------------------------------------------------


@dataclass
class FailoverResult:
    kills: int
    rate: float
    workers: int
    rounds: list[Round]
    kill_to_first_assignment_s: dict[str, float]
    kill_to_ready_s: dict[str, float]
    kill_to_lease_taken_s: dict[str, float]
    leader_rebuild_s: dict[str, float]
    failed_submit_batches: int
    outcome: Outcome


def run_failover(
    kills: int, *, rate: float, workers: int, credits: int, warmup_s: float, settle_s: float
) -> FailoverResult:
    from dispatch.auth import ensure_dev_keys

    with scratch_stack("dispatch-failover-bench-", streaming=True) as stack:
        settings = stack.settings
        keys = ensure_dev_keys(settings.auth)
        urls = [node.url for node in stack.nodes]
        rounds: list[Round] = []
        with (
            httpx.Client() as http,
            AckingWorkers(urls, keys["worker"], workers, credits) as acking,
            Submitter(urls, keys["client"], rate) as submitter,
        ):
            waited = wait_for_first_snapshot(settings)
            print(f"the fold's first snapshot after {waited:.0f} s of load", flush=True)
            time.sleep(warmup_s)
            for number in range(1, kills + 1):
                rounds.append(failover_round(http, stack, acking, settle_s))
                print(f"round {number}: {rounds[-1]}", flush=True)
            submitter.stop.set()
            submitter.thread.join(60)
            outcome = wait_all_succeeded(settings, submitter.accepted, timeout_s=300)
            failed = submitter.failed_batches

    def column(name: str) -> list[float]:
        values = (getattr(r, name) for r in rounds)
        return [value for value in values if value is not None]

    return FailoverResult(
        kills=kills,
        rate=rate,
        workers=workers,
        rounds=rounds,
        kill_to_first_assignment_s=p50_max(column("kill_to_first_assignment_s")),
        kill_to_ready_s=p50_max(column("kill_to_ready_s")),
        kill_to_lease_taken_s=p50_max(column("kill_to_lease_taken_s")),
        leader_rebuild_s=p50_max(column("leader_rebuild_s")),
        failed_submit_batches=failed,
        outcome=outcome,
    )


@unwinds_on_sigterm
def main(argv: list[str] | None = None) -> int:
    from dispatch.bench import rebuild_bench

    parser = argparse.ArgumentParser(
        prog="python -m dispatch.bench.failover_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--kills", type=int, default=10, help="failover rounds")
    parser.add_argument("--rate", type=float, default=200.0, help="jobs/s submitted")
    parser.add_argument("--workers", type=int, default=4, help="REST worker threads")
    parser.add_argument("--credits", type=int, default=50, help="credits per worker poll")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before round 1")
    parser.add_argument("--settle", type=float, default=3.0, help="load between rounds (s)")
    parser.add_argument("--skip-failover", action="store_true")
    parser.add_argument("--skip-rebuild", action="store_true")
    rebuild_bench.add_arguments(parser)
    parser.add_argument("--out", type=Path, help="also write the results as JSON to this file")
    args = parser.parse_args(argv)

    results: dict[str, Any] = {
        "machine_cores": multiprocessing.cpu_count(),
        "load_average_at_start": os.getloadavg(),
    }
    if not args.skip_failover:
        failover = run_failover(
            args.kills, rate=args.rate, workers=args.workers, credits=args.credits,
            warmup_s=args.warmup, settle_s=args.settle,
        )  # fmt: skip
        results["failover"] = asdict(failover)
        print(json.dumps(results["failover"], indent=1), flush=True)
    if not args.skip_rebuild:
        rebuild_bench.show_fold_progress()
        results["rebuild"] = rebuild_bench.run_rebuild_bench(
            rebuild_bench.shape_of(args),
            fold_records=args.fold_records,
            repeats=args.repeats,
            profile=not args.no_profile,
        )
    results["load_average_at_end"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

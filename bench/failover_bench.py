"""Failover benchmark: `kill -9` the leader under load, time until the standby serves.

    .venv/bin/python -m dispatch.bench.failover_bench                   # 10 kills, then the rebuild
    .venv/bin/python -m dispatch.bench.failover_bench --kills 10 --skip-rebuild --out out.json
    .venv/bin/python -m dispatch.bench.failover_bench --skip-failover  # = python -m
    dispatch.bench.rebuild_bench

**Failover.** A real local stack (`LocalStack`, `StackPlan(streaming=True, workers=0)`) in a
temporary folder on free ports: the broker, the streaming fold and two `dispatch serve`
processes sharing the lease table. The load: one submitter thread, the SDK's `Client` with
both node URLs, `--rate` jobs/s in batches every 100 ms; `--workers` REST worker threads
that long-poll, ack every assignment at once, and move to the other node when one does not
answer (as `tests/integration/api/processes.Workers` does), each noting when it received
each assignment and the epoch of its lease token ("{epoch}.{n}").

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
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from string import hexdigits
from typing import Any

import httpx

from dispatch.bench.signals import unwinds_on_sigterm
from dispatch.settings import Settings, load_settings
from dispatch.stack.local import ApiNode, LocalStack
from dispatch.stack.plan import StackPlan
from dispatch.stack.ports import free_port, free_port_run
from dispatch.warehouse import Warehouse

EXEC = "bench.noop"
SUBJECTS = ["job.assign.>"]
READY_POLL_S = 0.02
BATCH_EVERY_S = 0.1
WORKER_RETRY_S = 0.05
"""A worker's pause before trying the other node, when one did not answer."""


# --- pure helpers --------------------------------------------------------------------------------


def lease_epoch(token: str) -> int:
    """The epoch of a lease "{epoch}.{token}" (the leader that made the assignment; the
    token is random hex)."""
    epoch, dot, secret = token.partition(".")
    if not dot or not epoch.isdigit() or not secret or not all(c in hexdigits for c in secret):
        raise ValueError(f"not a lease token: {token!r}")
    return int(epoch)


def p50_max(values: Sequence[float]) -> dict[str, float]:
    """Median and maximum (and count), rounded to the millisecond; {} when empty."""
    if not values:
        return {}
    return {
        "p50": round(statistics.median(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


@dataclass(frozen=True, slots=True)
class Receipt:
    at: float
    """time.monotonic() when the worker got the assignment."""
    epoch: int
    job_id: str


def first_receipt(receipts: Sequence[Receipt], *, after: float, epoch: int) -> Receipt | None:
    """The earliest assignment of `epoch` received at or after `after`."""
    matching = [r for r in receipts if r.epoch == epoch and r.at >= after]
    return min(matching, key=lambda receipt: receipt.at) if matching else None


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


class Submitter:
    """`rate` jobs/s through the SDK's `Client` (both nodes), in a batch every 100 ms."""

    def __init__(self, urls: Sequence[str], key: str, rate: float) -> None:
        self.urls, self.key, self.rate = list(urls), key, rate
        self.accepted: list[str] = []
        self.failed_batches = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="submitter")

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

    def __enter__(self) -> Submitter:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


class AckingWorkers:
    """REST workers that ack every assignment at once and note when each arrived.

    They follow 307s and move to the other node when one does not answer; an ack that finds
    no node is retried on the other one. The HA tests use them too
    (`tests/integration/api/processes.Workers`)."""

    def __init__(self, urls: Sequence[str], key: str, count: int, credits: int) -> None:
        self.urls, self.key, self.credits = list(urls), key, credits
        self.receipts: list[Receipt] = []
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._work, args=(f"fo-w{n}",), name=f"worker-{n}")
            for n in range(count)
        ]

    def __enter__(self) -> AckingWorkers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def snapshot(self) -> list[Receipt]:
        with self._lock:
            return list(self.receipts)

    def _work(self, worker_id: str) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        turn = 0
        body = {"subjects": SUBJECTS, "credits": self.credits, "wait_s": 0.5}
        with httpx.Client(headers=headers, timeout=10, follow_redirects=True) as http:
            while not self.stop.is_set():
                url = self.urls[turn % len(self.urls)]
                try:
                    polled = http.post(f"{url}/v1/workers/{worker_id}/poll", json=body)
                except httpx.TransportError:
                    polled = None
                if polled is None or polled.status_code != 200:
                    turn += 1
                    time.sleep(WORKER_RETRY_S)
                    continue
                assignments = polled.json()["assignments"]
                if assignments:
                    self._note(assignments)
                    turn = self._ack(http, turn, assignments)

    def _note(self, assignments: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        with self._lock:
            self.receipts += [Receipt(now, lease_epoch(a["lease"]), a["id"]) for a in assignments]

    def _ack(self, http: httpx.Client, turn: int, assignments: list[dict[str, Any]]) -> int:
        """Ack on whichever node answers, for up to 20 s; returns the node turn to go on with
        (an unacked job is requeued at its deadline anyway)."""
        acks = [{"id": a["id"], "attempt": a["attempt"], "lease": a["lease"]} for a in assignments]
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline and not self.stop.is_set():
            url = self.urls[turn % len(self.urls)]
            try:
                answer = http.post(f"{url}/v1/jobs:ack", json={"acks": acks})
                if answer.status_code == 200 or 400 <= answer.status_code < 500:
                    return turn
            except httpx.TransportError:
                pass
            turn += 1
            time.sleep(WORKER_RETRY_S)
        return turn


# --- the stack -----------------------------------------------------------------------------------


def distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
        time.sleep(0.001)
    return ports


def cluster_profile_settings(scratch: Path, spark_workers: int = 1) -> Settings:
    """The `cluster` profile (conf/profiles/cluster.toml: 3 brokers, the object store, a Spark
    cluster, 3 API nodes) on free ports under `scratch`, with `spark_workers` workers (one
    by default: a second costs a core this machine does not have)."""
    first_broker = free_port_run(6)
    store, master, *api_ports = distinct_free_ports(5)
    return load_settings(
        "cluster",
        paths={"var": str(scratch / "var")},
        kafka={
            "bootstrap": f"127.0.0.1:{first_broker}",
            "controller_port": first_broker + 1,
            "start_timeout_s": 180.0,
        },
        storage={"endpoint_url": f"http://127.0.0.1:{store}"},
        spark={"master": f"spark://127.0.0.1:{master}", "cluster_workers": spark_workers},
        api={"ports": api_ports},
        dispatcher={"default_cap": 1_000_000},
    )


def stack_settings(scratch: Path) -> Settings:
    bootstrap, controller, first, second = distinct_free_ports(4)
    return load_settings(
        paths={"var": str(scratch / "var"), "warehouse": str(scratch / "delta")},
        kafka={"bootstrap": f"127.0.0.1:{bootstrap}", "controller_port": controller},
        api={"ports": [first, second]},
        dispatcher={"default_cap": 1_000_000},
    )


@contextlib.contextmanager
def running_stack(settings: Settings, *, streaming: bool = True) -> Iterator[LocalStack]:
    """`up` (the brokers, topics, the streaming fold unless not `streaming`, the nodes);
    `down` whatever happens: each process is stopped by the pid its pid file records."""
    stack = LocalStack(settings, StackPlan(streaming=streaming, workers=0))
    try:
        stack.up()
        yield stack
    finally:
        stack.down()


def wait_for_first_snapshot(settings: Settings, timeout_s: float = 300.0) -> float:
    """Until the streaming fold committed its first batch (a failover then rebuilds from a
    snapshot, as in steady operation); returns the seconds waited."""
    from dispatch.delta import tables as t
    from dispatch.delta.progress import latest_progress

    started = time.monotonic()
    warehouse = Warehouse.of(settings)
    while latest_progress(warehouse, t.JOBS) is None:
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"the streaming fold committed nothing in {timeout_s:.0f} s")
        time.sleep(1.0)
    return time.monotonic() - started


def readiness(http: httpx.Client, node: ApiNode) -> tuple[int, dict[str, Any]] | None:
    try:
        answer = http.get(f"{node.url}/readyz", timeout=1.0)
    except httpx.TransportError:
        return None
    return answer.status_code, answer.json()


def find_leader(http: httpx.Client, nodes: Sequence[ApiNode]) -> tuple[ApiNode, int]:
    """The node whose `/readyz` answers 200, and its epoch (waits up to 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for node in nodes:
            seen = readiness(http, node)
            if seen is not None and seen[0] == 200:
                return node, int(seen[1]["epoch"])
        time.sleep(0.1)
    raise RuntimeError("no node is the ready leader")


def wait_ready(http: httpx.Client, node: ApiNode, timeout_s: float) -> tuple[float, int]:
    """Poll `/readyz` every 20 ms until 200: (time.monotonic() then, its epoch)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = readiness(http, node)
        if seen is not None and seen[0] == 200:
            return time.monotonic(), int(seen[1]["epoch"])
        time.sleep(READY_POLL_S)
    raise RuntimeError(f"{node.url} did not become the ready leader in {timeout_s:.0f} s")


def wait_first_receipt(
    workers: AckingWorkers, *, after: float, epoch: int, timeout_s: float
) -> Receipt:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = first_receipt(workers.snapshot(), after=after, epoch=epoch)
        if found is not None:
            return found
        time.sleep(READY_POLL_S)
    raise RuntimeError(f"no assignment of epoch {epoch} within {timeout_s:.0f} s")


def kill_9(node: ApiNode) -> None:
    """SIGKILL the node's process by the pid its pid file records, and reap it."""
    record = node.process.record()
    if record is None:
        raise RuntimeError(f"{node.url}: no running process to kill")
    os.kill(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while node.process.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.01)


def restart_as_standby(node: ApiNode, timeout_s: float = 90.0) -> float:
    """Start the node again; returns seconds until its `/healthz` answered."""
    started = time.monotonic()
    node.start()
    while not node.answers("/healthz"):
        if node.process.record() is None:
            raise RuntimeError(f"{node.url} exited on restart:\n{node.process.log_tail()}")
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"{node.url} did not answer /healthz in {timeout_s:.0f} s")
        time.sleep(0.1)
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
    kill_9(leader)
    ready_at, new_epoch = wait_ready(http, standby, timeout_s=60)
    first = wait_first_receipt(workers, after=killed_at, epoch=new_epoch, timeout_s=60)
    term = term_log(standby.process.log_file.read_text(errors="replace"), new_epoch)
    restart_s = restart_as_standby(leader)
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


# --- none lost -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    accepted: int
    succeeded: int
    not_succeeded: list[str]
    completed_twice: int
    wait_s: float


def outcome_in_log(settings: Settings, accepted: Sequence[str]) -> Outcome:
    """The committed log replayed into an empty core (the fence applied, as a new leader
    does): how many accepted jobs are succeeded, and completions per job."""
    from dispatch.api.kafka_log import replay_events
    from dispatch.core.dispatcher import Dispatcher
    from dispatch.core.events import Completed

    core = Dispatcher(settings.dispatcher.core_config())
    completions: Counter[str] = Counter()
    for batch in replay_events(settings.kafka, client_id="failover-bench-audit"):
        if batch.group != settings.dispatcher.group:
            continue
        core.apply_all(batch.events)
        completions.update(e.job_id for e in batch.events if isinstance(e, Completed))
    missing = []
    for job_id in accepted:
        job = core.job(job_id)
        if job is None or job.status.value != "succeeded":
            missing.append(job_id)
    return Outcome(
        accepted=len(accepted),
        succeeded=len(accepted) - len(missing),
        not_succeeded=missing[:20],
        completed_twice=sum(1 for count in completions.values() if count > 1),
        wait_s=0.0,
    )


def wait_all_succeeded(settings: Settings, accepted: Sequence[str], timeout_s: float) -> Outcome:
    started = time.monotonic()
    while True:
        outcome = outcome_in_log(settings, accepted)
        outcome.wait_s = round(time.monotonic() - started, 1)
        if not outcome.not_succeeded or outcome.wait_s > timeout_s:
            return outcome
        time.sleep(5.0)


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

    with tempfile.TemporaryDirectory(prefix="dispatch-failover-bench-") as scratch:
        settings = stack_settings(Path(scratch))
        with running_stack(settings) as stack:
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

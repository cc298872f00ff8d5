"""Peer comparison: Celery and Dramatiq on Redis beside `dispatch bench`, in one run.

    .venv/bin/pip install -c constraints.txt -e '.[peers]'   # celery, dramatiq, redis-py
    .venv/bin/python -m dispatch.bench.peers         # --jobs 20000 --dispatch-clients 64
    .venv/bin/python -m dispatch.bench.peers --skip-dispatch --jobs 2000  # the peers only, a smoke
    run .venv/bin/python -m dispatch.bench.peers --json

The protocol for each peer (the figures only compare within one run, on one machine, so the
machine, its load at the start and the end, and the versions are printed with them):
- Redis with AOF on, `appendfsync everysec` (durability comparable to Kafka acks=all on one
  broker), RDB snapshots off: a fresh redis-server for each measurement, on a free loopback
  port with a temporary data directory, started by the bench and stopped by its pid.
  redis-server comes from PATH, or from Debian's packages unpacked into
  `~/.cache/dispatch/redis/` (`bench/peer_tasks/redis_server.py`).
- No-op tasks, acked late: Celery with `task_acks_late=True` and Celery's default
  `worker_prefetch_multiplier` (4); Dramatiq's Redis broker acks after processing by default.
  `--jobs` jobs (20,000), submitted one by one in a loop of this process (no batching API).
- End to end: the workers run (Celery: `celery worker` with prefork concurrency 2; Dramatiq:
  `dramatiq --processes 2 --threads 8`), started as subprocesses in a process group of their
  own and stopped by it; the clock runs from the first submit (`apply_async()`, `send()`) to
  the completion of the last task. Each task INCRs a counter in the same Redis; the one that
  brings it to `--jobs` stamps the time (`bench/peer_tasks/counter.py` says why a counter).
- Enqueue: the same submit loop with no worker running, jobs/s of the loop.

Our side: `dispatch bench --json --batch 1 --clients N --jobs J --sdk-loop 5000` as a
subprocess; from its JSON, `jobs_per_s` (end to end, single-job requests from N concurrent
clients), `submit_requests_per_s` (single-job requests accepted per second from N clients) and
`sdk_loop_jobs_per_s` (a sequential `Client.submit` loop). A failed dispatch run is reported
(its stderr's tail) and the peers' figures are printed all the same. Ratios are dispatch/peer.
The peers' concurrent enqueue is not measured (n/a).

CPU per job by process, over each end-to-end run (`dispatch.bench.process_cpu`): for a peer,
its redis-server, each worker process (the worker's main process and its pool or worker
processes) and this process (the submit loop); for dispatch, the tables `dispatch bench`
reports (broker, leader node, its workers, its load generator; the SDK loop's on its own).
Each with the rest of the machine, in µs per job.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from dispatch.bench import stats
from dispatch.bench.peer_tasks.redis_server import RedisUnavailable, find_redis
from dispatch.bench.peer_tasks.runner import PeerResult, run_peers, tail
from dispatch.bench.process_cpu import CpuReport, format_table

REPO = Path(__file__).resolve().parent.parent
DISPATCH = str(Path(sys.executable).parent / "dispatch")
SDK_LOOP_JOBS = 5000
DISPATCH_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class DispatchResult:
    status: str
    """"ok", "failed" or "skipped"."""
    jobs_per_s: float | None = None
    submit_requests_per_s: float | None = None
    sdk_loop_jobs_per_s: float | None = None
    error: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    measure: str
    dispatch: float | None
    peers: dict[str, float | None]
    ratios: dict[str, float | None]


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """dispatch / peer, or None when either side has no figure."""
    if ours is None or not theirs:
        return None
    return round(ours / theirs, 2)


def comparison_rows(dispatch: DispatchResult, peers: Sequence[PeerResult]) -> list[Row]:
    measures: list[tuple[str, float | None, Callable[[PeerResult], float | None]]] = [
        ("end to end jobs/s", dispatch.jobs_per_s, lambda p: p.e2e_jobs_per_s),
        ("single-job enqueue/s, one loop", dispatch.sdk_loop_jobs_per_s, lambda p: p.enqueue_per_s),
        ("single-job enqueue/s, concurrent", dispatch.submit_requests_per_s, lambda _p: None),
    ]
    rows = []
    for measure, ours, figure in measures:
        theirs = {peer.name: figure(peer) for peer in peers}
        rows.append(
            Row(measure, ours, theirs, {name: ratio(ours, value) for name, value in theirs.items()})
        )
    return rows


def cell(value: float | None, failed: bool = False, skipped: bool = False) -> str:
    if failed:
        return "failed"
    if skipped:
        return "skipped"
    return "n/a" if value is None else f"{value:,.0f}"


def ratio_cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def table(dispatch: DispatchResult, peers: Sequence[PeerResult]) -> Any:
    """The comparison as a rich Table (typed Any: rich is imported here, not at module level)."""
    from rich.table import Table

    result = Table(
        "measure", "dispatch", *(p.name for p in peers), title="jobs/s, higher is better"
    )
    for peer in peers:
        result.add_column(f"dispatch/{peer.name}", justify="right")
    for column in result.columns[1:]:
        column.justify = "right"
    failed = {peer.name: peer.error is not None for peer in peers}
    for row in comparison_rows(dispatch, peers):
        result.add_row(
            row.measure,
            cell(row.dispatch, dispatch.status == "failed", dispatch.status == "skipped"),
            *(cell(value, failed[name]) for name, value in row.peers.items()),
            *(ratio_cell(value) for value in row.ratios.values()),
        )
    return result


def parse_dispatch(stdout: str) -> DispatchResult:
    """The figures of `dispatch bench --json`'s output (a JSON object, maybe after log lines)."""
    start = stdout.find("\n{") + 1 if not stdout.lstrip().startswith("{") else 0
    raw = json.loads(stdout[start:])
    if not isinstance(raw, dict):
        raise ValueError("dispatch bench --json printed no JSON object")

    def figure(key: str) -> float | None:
        value = raw.get(key)
        return float(value) if isinstance(value, int | float) else None

    return DispatchResult(
        "ok",
        jobs_per_s=figure("jobs_per_s"),
        submit_requests_per_s=figure("submit_requests_per_s"),
        sdk_loop_jobs_per_s=figure("sdk_loop_jobs_per_s"),
        raw=raw,
    )


def dispatch_argv(jobs: int, clients: int) -> list[str]:
    return [
        DISPATCH, "bench", "--json", "--batch", "1", "--clients", str(clients),
        "--jobs", str(jobs), "--sdk-loop", str(SDK_LOOP_JOBS),
    ]  # fmt: skip


def run_dispatch(jobs: int, clients: int) -> DispatchResult:
    try:
        done = subprocess.run(
            dispatch_argv(jobs, clients),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=DISPATCH_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,  # a failed run is reported with its stderr, below
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return DispatchResult("failed", error=str(error))
    if done.returncode != 0:
        return DispatchResult("failed", error=tail(done.stderr or done.stdout))
    try:
        return parse_dispatch(done.stdout)
    except ValueError as error:  # json.JSONDecodeError is a ValueError
        return DispatchResult("failed", error=f"{error}: {tail(done.stdout)}")


def cpu_tables(dispatch: DispatchResult, peers: Sequence[PeerResult]) -> list[str]:
    """The CPU-per-job tables of the run: dispatch's (from its JSON), then each peer's."""
    titled: list[tuple[str, CpuReport]] = []
    for key, what in (("cpu", "end to end"), ("sdk_loop_cpu", "SDK loop")):
        raw = dispatch.raw.get(key)
        if isinstance(raw, dict):
            titled.append((f"dispatch, {what}: CPU per job by process", CpuReport.from_dict(raw)))
    titled += [
        (f"{peer.name}, end to end: CPU per job by process", peer.cpu)
        for peer in peers
        if peer.cpu is not None
    ]
    return [format_table(report, title) for title, report in titled]


def machine(redis_version: str | None) -> dict[str, Any]:

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {
        **stats.machine(),
        "versions": {
            "celery": version("celery"),
            "kombu": version("kombu"),
            "dramatiq": version("dramatiq"),
            "redis-py": version("redis"),
            "redis-server": redis_version,
        },
    }


def missing_extra() -> list[str]:
    """The packages of the `peers` extra that are not installed."""
    return [name for name in ("celery", "dramatiq", "redis") if not importlib.util.find_spec(name)]


# --- the command -----------------------------------------------------------------------------


def report(
    jobs: int,
    clients: int,
    info: dict[str, Any],
    dispatch: DispatchResult,
    peers: Sequence[PeerResult],
) -> dict[str, Any]:
    return {
        "jobs": jobs,
        "dispatch_clients": clients,
        "machine": info,
        "dispatch": asdict(dispatch),
        "peers": {peer.name: asdict(peer) for peer in peers},
        "rows": [asdict(row) for row in comparison_rows(dispatch, peers)],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch.bench.peers", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (default 20000)")
    parser.add_argument("--dispatch-clients", type=int, default=64, help="dispatch bench --clients")
    parser.add_argument("--skip-dispatch", action="store_true", help="run the peers only")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    load_start = os.getloadavg()
    missing = missing_extra()
    if missing:
        hint = ".venv/bin/pip install -c constraints.txt -e '.[peers]'"
        print(f"missing {', '.join(missing)}: {hint}", file=sys.stderr)
        return 2
    # Before dispatch's run, which takes minutes: without Redis there is nothing to compare.
    try:
        binary = find_redis()
    except RedisUnavailable as error:
        print(f"redis-server unavailable: {error}", file=sys.stderr)
        return 2
    dispatch = (
        DispatchResult("skipped")
        if args.skip_dispatch
        else run_dispatch(args.jobs, args.dispatch_clients)
    )
    peers = run_peers(binary, args.jobs)
    info = machine(binary.version())
    info["load_average"] = {"start": list(load_start), "end": list(os.getloadavg())}
    result = report(args.jobs, args.dispatch_clients, info, dispatch, peers)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0

    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=120)

    def say(text: str) -> None:
        # Not cut at the console's width, nor coloured: these lines are copied into reports.
        console.print(text, soft_wrap=True, highlight=False, markup=False)

    versions = ", ".join(f"{name} {value}" for name, value in info["versions"].items())
    loads = info["load_average"]
    say(
        f"machine: nproc {info['nproc']}, {info['cpu']}, CPython {info['python']}; load average "
        f"(1/5/15 min) {' '.join(f'{v:.2f}' for v in loads['start'])} at start, "
        f"{' '.join(f'{v:.2f}' for v in loads['end'])} at end"
    )
    say(f"versions: {versions}")
    say(f"jobs per run: {args.jobs:,}; dispatch clients: {args.dispatch_clients}")
    if dispatch.status == "failed":
        say(f"dispatch bench failed: {dispatch.error}")
    console.print(table(dispatch, peers))
    if dispatch.status == "ok":
        say(
            f"dispatch (bench --batch 1 --clients {args.dispatch_clients}, SDK loop of "
            f"{SDK_LOOP_JOBS:,} calls): end to end {dispatch.raw.get('seconds')} s; raw "
            f"kafka-python in the same run {dispatch.raw.get('raw_kafka_records_per_s')} records/s"
        )
    for peer in peers:
        if peer.error is not None:
            say(f"{peer.name} failed: {peer.error}")
            continue
        say(
            f"{peer.name} ({peer.workers}): end to end {peer.e2e_seconds:.2f} s, its submit loop "
            f"{peer.e2e_submit_per_s:,.0f}/s beside the workers, {peer.completed:,} completions; "
            f"enqueue only {peer.enqueue_seconds:.2f} s"
        )
    for text in cpu_tables(dispatch, peers):
        say("")
        say(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

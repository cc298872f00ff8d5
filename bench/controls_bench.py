"""How fast the everyday controls act, end to end on a real local stack: cancelling a running
job, the hard time limit of an attempt (`max_run_s`), and progress reports.

    .venv/bin/python -m dispatch.bench.controls_bench [--jobs 50] [--transport ws|rest|both]
        [--parallel 8] [--json]

A local stack on a temporary folder and free ports (`LocalStack.up`: a broker and the leader
node, no fold), then, per transport, a worker process of this module's own (the worker SDK,
`WorkerApp`, `concurrency` 32) with four handlers that print what they see, with its wall time
(`time.time()`; one machine, one clock), as a JSON line:

- `bench.ctl.sync`: a sync handler that loops until `job.cancelled`, checking every 10 ms;
- `bench.ctl.async`: an async handler that sleeps until its task is cancelled
  (`asyncio.CancelledError`);
- `bench.ctl.forever`: a sync handler that heartbeats (the SDK's default) and loops until told
  to stop, for the time limit;
- `bench.ctl.progress`: a sync handler that reports progress once, then waits to be cancelled.

Figures, each over `--jobs` jobs per transport, `--parallel` jobs at a time (each job on a
thread of this process with its own HTTP connection):

1. *cancel → handler saw it*: from just before `POST /v1/jobs/{id}/cancel` to the handler's
   observation (sync and async handlers separately);
2. *cancel → cancelled*: from the same moment to `GET /v1/jobs/{id}?wait=` answering the job
   `cancelled`;
3. *time-limit overshoot*: a job with `max_run_s` 1.0 whose handler runs forever: when the
   handler saw the stop minus the attempt's `run_limit_at` (its start + `max_run_s`, read
   from `GET /v1/jobs/{id}` while it runs);
4. *progress → visible*: from just before the handler's `job.progress(...)` to the first
   `GET /v1/jobs/{id}` (polled every 5 ms) that shows it; also *progress → kept*, the report's
   `at` (the leader's time of keeping it) minus the same start.

Each figure's p50/p95/max (ms), and the CPU seconds (user + system, /proc) of every process
over each transport's run. Every process this bench starts is stopped by its pid, whatever
happens (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from dispatch.bench.signals import sigterm_unwinds, terminate
from dispatch.bench.stats import machine, steal_percent

EXECS = {
    "sync": "bench.ctl.sync",
    "async": "bench.ctl.async",
    "forever": "bench.ctl.forever",
    "progress": "bench.ctl.progress",
}
MAX_RUN_S = 1.0
WORKER_CONCURRENCY = 32
POLL_S = 0.005
"""How often a progress report is looked for."""
EVENT_TIMEOUT_S = 90.0
"""Longest wait for a handler's line (the cancel grace, 30 s, is well inside it)."""

FIGURES = {
    "cancel_seen_sync": "cancel → handler saw it (sync, 10 ms checks)",
    "cancel_seen_async": "cancel → handler saw it (async, CancelledError)",
    "cancelled_sync": "cancel → job `cancelled` (sync)",
    "cancelled_async": "cancel → job `cancelled` (async)",
    "time_limit_overshoot": "time limit: handler saw the stop - run_limit_at",
    "progress_visible": "progress → visible in GET /v1/jobs/{id}",
    "progress_kept": "progress → kept by the leader (its `at`)",
}
"""The figures, in the report's order, with their labels."""


# --- the pure parts: statistics and the report -----------------------------------------------


def summarize(seconds: list[float]) -> dict[str, float | int]:
    """n, p50/p95/max of durations in seconds, in milliseconds (nearest rank, as
    `dispatch.bench.stats.percentiles`). Empty: only n = 0."""
    if not seconds:
        return {"n": 0}
    ordered = sorted(seconds)

    def at(fraction: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 1)

    return {"n": len(ordered), "p50": at(0.50), "p95": at(0.95),
            "max": round(1000 * ordered[-1], 1)}  # fmt: skip


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds of each process between two readings (the processes of the later one)."""
    return {name: round(after[name] - before.get(name, 0.0), 2) for name in after}


def format_report(results: dict[str, dict[str, Any]]) -> str:
    """A table per transport: one row per figure (n, p50, p95, max in ms), then each
    process's CPU seconds over that transport's run."""
    lines: list[str] = []
    for transport, result in results.items():
        lines.append(
            f"== {transport} ({result.get('seconds', 0):.0f} s, worker slots "
            f"{result.get('worker_slots')}, {result.get('parallel')} jobs at a time)"
        )
        lines.append(f"{'figure':52} {'n':>4} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9}")
        for key, label in FIGURES.items():
            row = result["figures"].get(key, {"n": 0})
            cells = [f"{row[name]:9.1f}" if name in row else f"{'-':>9}"
                     for name in ("p50", "p95", "max")]  # fmt: skip
            lines.append(f"{label:52} {row['n']:>4} {' '.join(cells)}")
        cpu = result.get("cpu_s", {})
        if cpu:
            lines.append(
                "CPU s: " + ", ".join(f"{name} {value:.2f}" for name, value in cpu.items())
            )
        if result.get("unexpected"):
            lines.append(f"unexpected: {result['unexpected'][:5]}")
    return "\n".join(lines)


# --- the worker (a process of its own) -------------------------------------------------------


def _worker_main(url: str, key: str, transport: str, slots: int) -> int:
    from dispatch.worker import Assignment, WorkerApp

    lock = threading.Lock()

    def emit(event: str, job: Assignment, **more: Any) -> None:
        line = json.dumps({"event": event, "id": job.id, "t": time.time(), **more})
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    app = WorkerApp("controls-bench", concurrency=slots, grace_s=2.0,
                    transport="rest" if transport == "rest" else "ws")  # fmt: skip

    def loop_until_stopped(job: Assignment) -> None:
        emit("started", job)
        while not job.cancelled:
            time.sleep(0.01)
        emit("seen", job, reason=job.cancel_reason)
        job.raise_if_cancelled()

    @app.handler(EXECS["sync"])
    def sync_handler(job: Assignment) -> None:
        loop_until_stopped(job)

    @app.handler(EXECS["forever"])
    def forever_handler(job: Assignment) -> None:
        loop_until_stopped(job)

    @app.handler(EXECS["async"])
    async def async_handler(job: Assignment) -> None:
        emit("started", job)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            emit("seen", job, reason=job.cancel_reason)
            raise

    @app.handler(EXECS["progress"])
    def progress_handler(job: Assignment) -> None:
        emit("started", job)
        time.sleep(0.1)
        reported = time.time()
        job.progress(1, 2, "half way")
        emit("reported", job, reported=reported)
        while not job.cancelled:
            time.sleep(0.01)
        job.raise_if_cancelled()

    print(json.dumps({"event": "ready"}), flush=True)
    app.run(urls=url, api_key=key)
    return 0


class WorkerProcess:
    """The worker, started by this bench and stopped by its pid; a thread reads its lines."""

    def __init__(self, url: str, key: str, transport: str, slots: int, log_file: Path) -> None:
        self._log = log_file.open("wb")
        self.log_file = log_file
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dispatch.bench.controls_bench", "--role", "worker",
             "--url", url, "--key", key, "--transport", transport, "--worker-slots", str(slots)],
            stdout=subprocess.PIPE, stderr=self._log,
            start_new_session=True,  # Ctrl-C reaches the bench, which stops it in order
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                with self._changed:
                    self.events[(line["event"], line.get("id", ""))] = line
                    self._changed.notify_all()

    def wait(
        self, event: str, job_id: str = "", timeout_s: float = EVENT_TIMEOUT_S
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while (event, job_id) not in self.events:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the worker exited:\n{self.log_tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {event!r} for {job_id!r} in {timeout_s:.0f} s")
                self._changed.wait(min(left, 0.5))
            return self.events[(event, job_id)]

    def log_tail(self) -> str:
        self._log.flush()
        return self.log_file.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """SIGTERM to its pid, SIGKILL after 15 s."""
        terminate(self.process, 15)
        self._reader.join(timeout=5)
        self._log.close()


# --- the measurements ------------------------------------------------------------------------


class Measure:
    """One transport's jobs against the leader at `url`, on `parallel` threads."""

    def __init__(self, url: str, key: str, transport: str, worker: WorkerProcess) -> None:
        self.url, self.key, self.transport, self.worker = url, key, transport, worker
        self.samples: dict[str, list[float]] = {name: [] for name in FIGURES}
        self.unexpected: list[str] = []
        self.resent = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def _http(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = httpx.Client(base_url=self.url, timeout=60,
                                  headers={"Authorization": f"Bearer {self.key}"})  # fmt: skip
            self._local.client = client
        return client

    def _call(self, method: str, path: str, **options: Any) -> httpx.Response:
        """One request; sent once more on a connection the node closed while it was idle
        (its keep-alive timeout, 5 s: a REST worker's cancel can take that long). Every call
        here may be repeated: ids are the bench's, a cancel asked twice answers the same."""
        try:
            return self._http().request(method, path, **options)
        except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
            with self._lock:
                self.resent += 1
            return self._http().request(method, path, **options)

    def _record(self, name: str, seconds: float) -> None:
        with self._lock:
            self.samples[name].append(seconds)

    def _odd(self, note: str) -> None:
        with self._lock:
            self.unexpected.append(note)

    def _submit(self, kind: str, **extra: Any) -> str:
        job_id = f"ctl-{self.transport}-{kind}-{uuid.uuid4().hex[:12]}"
        body = {"id": job_id, "exec": EXECS[kind], "max_attempts": 1, **extra}
        self._call("POST", "/v1/jobs", json=body).raise_for_status()
        return job_id

    def _get(self, job_id: str, wait_s: float = 0.0) -> dict[str, Any] | None:
        params = {"wait": wait_s} if wait_s else None
        answer = self._call("GET", f"/v1/jobs/{job_id}", params=params)
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        job: dict[str, Any] = answer.json()
        return job

    def _until_terminal(self, job_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while time.monotonic() < deadline:
            job = self._get(job_id, wait_s=30.0)
            if job is not None and job["status"] in ("succeeded", "dead", "cancelled", "expired"):
                return job
        raise TimeoutError(f"{job_id} did not end in {EVENT_TIMEOUT_S:.0f} s")

    def cancel_one(self, kind: str) -> None:
        job_id = self._submit(kind)
        self.worker.wait("started", job_id)
        asked = time.time()
        self._call("POST", f"/v1/jobs/{job_id}/cancel", json={"reason": "bench"}).raise_for_status()
        seen = self.worker.wait("seen", job_id)
        job = self._until_terminal(job_id)
        ended = time.time()
        self._record(f"cancel_seen_{kind}", seen["t"] - asked)
        self._record(f"cancelled_{kind}", ended - asked)
        if seen.get("reason") != "cancel_requested" or job["status"] != "cancelled":
            self._odd(f"{job_id}: reason {seen.get('reason')}, status {job['status']}")

    def time_limit_one(self) -> None:
        job_id = self._submit("forever", max_run_s=MAX_RUN_S)
        self.worker.wait("started", job_id)
        limit_at = None
        while limit_at is None:
            job = self._get(job_id)
            if job is not None and job["status"] != "running" and job["status"] != "queued":
                break
            limit_at = job.get("run_limit_at") if job is not None else None
            if limit_at is None:
                time.sleep(POLL_S)
        seen = self.worker.wait("seen", job_id)
        job = self._until_terminal(job_id)
        if limit_at is None:
            self._odd(f"{job_id}: no run_limit_at read while it ran")
            return
        self._record("time_limit_overshoot", seen["t"] - float(limit_at))
        if seen.get("reason") != "time_limit" or job.get("dead_reason") != "time_limit":
            self._odd(f"{job_id}: reason {seen.get('reason')}, {job['status']} "
                      f"{job.get('dead_reason')}")  # fmt: skip

    def progress_one(self) -> None:
        job_id = self._submit("progress")
        self.worker.wait("started", job_id)
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        progress = None
        while progress is None and time.monotonic() < deadline:
            job = self._get(job_id)
            progress = job.get("progress") if job is not None else None
            if progress is None:
                time.sleep(POLL_S)
        visible = time.time()
        reported = float(self.worker.wait("reported", job_id)["reported"])
        if progress is None:
            self._odd(f"{job_id}: no progress in {EVENT_TIMEOUT_S:.0f} s")
        else:
            self._record("progress_visible", visible - reported)
            self._record("progress_kept", float(progress["at"]) - reported)
        self._call("POST", f"/v1/jobs/{job_id}/cancel").raise_for_status()
        self._until_terminal(job_id)

    def run(self, jobs: int, parallel: int) -> None:
        plan: list[Callable[[], None]] = []
        for _ in range(jobs):
            plan += [lambda: self.cancel_one("sync"), lambda: self.cancel_one("async"),
                     self.time_limit_one, self.progress_one]  # fmt: skip
        with ThreadPoolExecutor(parallel) as pool:
            for future in [pool.submit(step) for step in plan]:
                try:
                    future.result()
                except Exception as error:  # noqa: BLE001 - one failed job is a finding
                    self._odd(f"{type(error).__name__}: {error}")


# --- the stack and the processes -------------------------------------------------------------


def _cpu_by_process(roots: dict[str, int]) -> dict[str, float]:
    from dispatch.bench.memory_bench import read_processes

    reading = read_processes(roots)
    own = os.times()
    return {**reading.cpu, "bench (clients)": own.user + own.system}


def _name(component: str) -> str:
    """A stack component's name in the report (the API node is the leader: one node)."""
    return "leader node" if component.startswith(("api", "node")) else component


def run_bench(transports: list[str], jobs: int, parallel: int, slots: int) -> dict[str, Any]:
    from dispatch.auth import ensure_dev_keys
    from dispatch.settings import load_settings
    from dispatch.stack.local import LocalStack
    from dispatch.stack.plan import StackPlan
    from dispatch.stack.ports import free_port

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="controls-bench-") as scratch:
        var = Path(scratch) / "var"
        settings = load_settings(
            paths={"var": str(var), "warehouse": str(var / "delta")},
            kafka={"bootstrap": f"127.0.0.1:{free_port()}", "controller_port": free_port()},
            api={"ports": [free_port()]},
        )
        stack = LocalStack(settings, StackPlan(streaming=False, workers=0))
        try:
            started = time.monotonic()
            stack.up()
            print(f"stack up in {time.monotonic() - started:.1f} s", flush=True)
            url = stack.nodes[0].url
            keys = ensure_dev_keys(settings.auth)
            roots = {_name(status.name): status.pid
                     for status in stack.status() if status.pid is not None}  # fmt: skip
            for transport in transports:
                results[transport] = _run_transport(
                    url, keys, transport, jobs, parallel, slots, roots, Path(scratch)
                )
        finally:
            stack.down()
    return results


def _run_transport(url: str, keys: dict[str, str], transport: str, jobs: int, parallel: int,
                   slots: int, roots: dict[str, int], scratch: Path) -> dict[str, Any]:  # fmt: skip
    worker = WorkerProcess(
        url, keys["worker"], transport, slots, scratch / f"worker-{transport}.log"
    )
    try:
        worker.wait("ready", timeout_s=60)
        time.sleep(2.0)  # its connection and first credit
        measured = {**roots, f"worker ({transport})": worker.pid}
        before, machine_before = _cpu_by_process(measured), machine()
        started = time.monotonic()
        measure = Measure(url, keys["client"], transport, worker)
        measure.run(jobs, parallel)
        seconds = time.monotonic() - started
        after, machine_after = _cpu_by_process(measured), machine()
    finally:
        worker.stop()
    print(f"[{transport}] {seconds:.0f} s", flush=True)
    return {
        "seconds": round(seconds, 1),
        "worker_slots": slots,
        "parallel": parallel,
        "figures": {name: summarize(values) for name, values in measure.samples.items()},
        "cpu_s": cpu_used(before, after),
        "unexpected": measure.unexpected,
        "requests_resent": measure.resent,
        "machine_before": machine_before,
        "steal_percent": steal_percent(machine_before, machine_after),
    }


@contextlib.contextmanager
def _interrupt_message() -> Iterator[None]:
    try:
        yield
    except KeyboardInterrupt:
        print("interrupted: the stack and the worker were stopped", file=sys.stderr)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50, help="jobs per figure and transport")
    parser.add_argument("--transport", choices=("ws", "rest", "both"), default="both")
    parser.add_argument("--parallel", type=int, default=8, help="jobs at a time")
    parser.add_argument(
        "--worker-slots",
        type=int,
        default=WORKER_CONCURRENCY,
        help="the worker's concurrency (at most --parallel: every slot busy)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON too")
    parser.add_argument("--role", choices=("worker",), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "worker":
        return _worker_main(args.url, args.key, args.transport, args.worker_slots)
    transports = ["ws", "rest"] if args.transport == "both" else [args.transport]
    with sigterm_unwinds(), _interrupt_message():
        results = run_bench(transports, args.jobs, args.parallel, args.worker_slots)
    print(format_report(results))
    if args.json:
        print(json.dumps({"command": " ".join(sys.argv), "transports": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

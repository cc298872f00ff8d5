"""The leader's memory under sustained load: RSS of every process of a local stack while jobs
are submitted at a steady rate for minutes, with the finished window (the defaults) against
the old behaviour (every finished job kept for a day), each on a fresh stack.

    .venv/bin/python -m dispatch.bench.memory_bench [--rate 500] [--minutes 10] [--sample-s 30]
        [--only new|old] [--out FILE] [--standby] [--connections 2]

Per variant: a local stack on a temporary folder and free ports (`LocalStack.up`, what
`dispatch up --detach` runs: a broker, the leader node, with `--standby` a standby node, the
fold, `dispatch streaming`), then two processes of this module's own, so that the load costs
the stack's processes nothing and is measured on its own: the workers (`--connections`
WebSocket workers on one event loop that ack every `bench.noop` job at once, as
`dispatch bench`'s do) and the submitters (open loop: the batch of 50 whose first job is job k
is due at `start + k / rate`, `POST /v1/jobs:batch` with client-chosen ids, so every id goes
through the dedup checks: the core's job dict and the filter of finished ids). Both print a
progress line a second.

Every `--sample-s` the RSS (VmRSS, /proc/PID/status) of each process is read, a process's
descendants summed under a name of their own (`dispatch streaming`'s Spark JVM is its
child), with the jobs submitted and completed so far (the leader's `/metrics`) and the jobs
the leader holds by status (`/v1/overview`'s `counts`; its first call starts the node's
dashboard sampler, a thread that reads the node's metrics once a second, in both variants).

Variants: `new`, the settings' defaults (`dispatcher.finished_window_s` 300 s,
`finished_max` 100,000); `old`, the behaviour before them, the same-run baseline
(`finished_window_s` 86,400, `finished_max` 10^9: nothing is pruned in a run). In both,
`dispatcher.default_cap` (jobs in flight per client; the submitters are one client) is
raised to 10,000 so that the cap never throttles the load.

The report (printed, and with `--out` written as JSON, every sample included): per process,
the RSS at the start and at the end of the load and its least-squares slope over the last half
of the load (MB a minute); the leader's slope also in KB per completed job; the rate achieved
(submitted and completed); the CPU seconds (user + system, /proc) of each process per 1,000
jobs completed.
Every process this bench starts is stopped by its pid, whatever happens (Ctrl-C, SIGTERM).
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from dispatch.bench.acking_worker import run_acking_worker
from dispatch.bench.signals import sigterm_unwinds, terminate
from dispatch.bench.stats import machine, steal_percent
from dispatch.bench.submitters import read_answer
from dispatch.settings import Settings, load_settings
from dispatch.stack.local import LocalStack
from dispatch.stack.plan import StackPlan
from dispatch.stack.ports import free_port
from dispatch.stack.process import proc_stat

VARIANTS: dict[str, dict[str, Any]] = {
    "new": {},
    "old": {"finished_window_s": 86_400.0, "finished_max": 1_000_000_000},
}
"""Dispatcher settings over the defaults, by variant."""

DEFAULT_CAP = 10_000
"""Jobs in flight per client in both variants (the default, 100, could throttle the load)."""

SETTLE_S = 45.0
"""At least this long between `up` and the load: the fold's JVM takes 1.6 cores over its
first 20 s (BENCHMARKS.md, *An idle node*); the load also waits for the fold's first batch."""

FIRST_BATCH_TIMEOUT_S = 240.0
DRAIN_TIMEOUT_S = 120.0
EXEC = "bench.noop"
MB = 1024 * 1024


# --- /proc ------------------------------------------------------------------------------------


def _process_table() -> dict[int, list[str]]:
    """/proc/PID/stat fields of every process (one walk)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := proc_stat(int(entry.name))) is not None:
            table[int(entry.name)] = fields
    return table


def _descendants(root: int, table: dict[int, list[str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, fields in table.items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _rss_bytes(pid: int) -> int:
    """VmRSS of one process (0 if it is gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


@dataclass
class Reading:
    """RSS (bytes) and CPU (seconds) of each named process at one moment. A root process's
    descendants are summed under `<name> children (<their commands>)`."""

    rss: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)


def read_processes(roots: dict[str, int]) -> Reading:
    table = _process_table()
    ticks = os.sysconf("SC_CLK_TCK")
    reading = Reading()

    def cpu(pid: int) -> float:
        fields = table.get(pid)
        return (int(fields[11]) + int(fields[12])) / ticks if fields else 0.0

    for name, root in roots.items():
        reading.rss[name] = _rss_bytes(root)
        reading.cpu[name] = cpu(root)
        below = _descendants(root, table)
        if below:
            label = children_label(name)
            reading.rss[label] = sum(_rss_bytes(pid) for pid in below)
            reading.cpu[label] = sum(cpu(pid) for pid in below)
    return reading


def children_label(name: str) -> str:
    return f"{name} children"


# --- the load's processes --------------------------------------------------------------------


def _progress(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


class OpenLoop:
    """Submits `rate` jobs/s for `seconds` in batches of `batch`, from `clients` keep-alive
    connections (each takes the next due batch). Refused batches are counted, not retried."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.total = int(plan["rate"] * plan["seconds"])
        self.accepted = 0
        self.existing = 0
        self.refused = 0
        self.requests = 0
        self.behind_s = 0.0
        """How late the newest request left after its due time."""
        self.behind_max_s = 0.0
        self.errors: list[str] = []
        self._next = 0
        self._payload = "p" * int(plan["payload_bytes"])

    async def run(self) -> None:
        self.started = time.monotonic()
        reporter = asyncio.create_task(self._report())
        try:
            await asyncio.gather(*(self._client() for _ in range(self.plan["clients"])))
        finally:
            reporter.cancel()
        self.finished = time.monotonic()
        _progress({**self._line(), "done": True,
                   "seconds": round(self.finished - self.started, 3)})  # fmt: skip

    def _line(self) -> dict[str, Any]:
        return {"elapsed": round(time.monotonic() - self.started, 3),
                "submitted": self.accepted, "existing": self.existing,
                "refused": self.refused, "requests": self.requests,
                "behind_s": round(self.behind_s, 3), "behind_max_s": round(self.behind_max_s, 3),
                "errors": self.errors[-3:]}  # fmt: skip

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            _progress(self._line())

    async def _client(self) -> None:
        plan = self.plan
        reader, writer = await asyncio.open_connection(plan["host"], plan["port"])
        try:
            while self._next < self.total:
                first = self._next
                last = min(first + plan["batch"], self.total)
                self._next = last
                due = self.started + first / plan["rate"]
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                self.behind_s = max(0.0, time.monotonic() - due)
                self.behind_max_s = max(self.behind_max_s, self.behind_s)
                jobs = [
                    {"id": f"{plan['prefix']}-{n}", "exec": EXEC, "payload": self._payload}
                    for n in range(first, last)
                ]
                body = json.dumps({"jobs": jobs}).encode()
                head = (
                    f"POST /v1/jobs:batch HTTP/1.1\r\nHost: {plan['host']}:{plan['port']}\r\n"
                    f"Authorization: Bearer {plan['key']}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                ).encode()
                writer.write(head + body)
                status, answer = await read_answer(reader)
                self.requests += 1
                if status in (200, 202):
                    accepted = json.loads(answer)["jobs"]
                    existing = sum(1 for job in accepted if job.get("existing"))
                    self.existing += existing
                    self.accepted += len(accepted) - existing
                else:
                    self.refused += last - first
                    self.errors.append(f"HTTP {status}: {answer[:200].decode(errors='replace')}")
        finally:
            writer.close()


class AckingWorkers:
    """`connections` WebSocket workers on one event loop that ack each assignment at once
    (acks of the last 2 ms in one message), as `dispatch bench`'s workers do."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.completed = 0
        self.connected = 0

    async def run(self) -> None:
        tasks = [asyncio.create_task(self._worker(n)) for n in range(self.plan["connections"])]
        while self.connected < len(tasks):
            await asyncio.sleep(0.05)
            for task in tasks:
                if task.done():
                    task.result()  # raises what the worker raised
        _progress({"ready": True, "completed": 0})
        while True:
            await asyncio.sleep(1.0)
            for task in tasks:
                if task.done():
                    task.result()
                    raise ConnectionError("a worker's connection was closed")
            _progress({"completed": self.completed})

    async def _worker(self, n: int) -> None:
        def connected() -> None:
            self.connected += 1

        def settled(count: int) -> None:
            self.completed += count

        await run_acking_worker(
            self.plan["url"], self.plan["key"], f"memory-bench-w{n}", self.plan["credit"],
            connected=connected, settled=settled,
        )  # fmt: skip


def _load_main(role: str) -> int:
    """The entry point of the load's processes: a JSON plan on stdin, progress on stdout."""
    import uvloop

    plan = json.load(sys.stdin)
    if role == "submit":
        uvloop.run(OpenLoop(plan).run())
    else:
        uvloop.run(AckingWorkers(plan).run())
    return 0


class LoadProcess:
    """One of the load's processes, started by this bench and stopped by its pid; a thread
    keeps its newest progress line."""

    def __init__(self, name: str, role: str, plan: dict[str, Any], log_file: Path) -> None:
        self.name = name
        self.latest: dict[str, Any] = {}
        self.log_file = log_file
        self._log = log_file.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dispatch.bench.memory_bench", "--role", role],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            start_new_session=True,  # Ctrl-C reaches the bench, which stops it in order
        )  # fmt: skip
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(plan).encode())
        self.process.stdin.close()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            with contextlib.suppress(ValueError):
                self.latest = json.loads(raw)

    def check(self) -> None:
        if self.process.poll() is not None and not self.latest.get("done"):
            raise RuntimeError(
                f"{self.name} exited ({self.process.returncode}):\n{self.log_tail()}"
            )

    def log_tail(self) -> str:
        self._log.flush()
        return self.log_file.read_text(errors="replace")[-3000:]

    def wait_for(self, key: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.latest.get(key):
            self.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no {key!r} in {timeout_s:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM to its pid, SIGKILL after 10 s."""
        terminate(self.process, 10)
        self._reader.join(timeout=5)
        self._log.close()


# --- the stack's figures ---------------------------------------------------------------------


def _metrics(url: str) -> dict[str, float]:
    """The leader's Prometheus figures this bench reads (label sets summed)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    wanted = {"dispatch_completed_total": "completed", "dispatch_enqueued_total": "enqueued",
              "dispatch_in_flight": "running", "dispatch_queue_depth": "queued",
              "dispatch_streaming_lag_records": "fold_lag_records",
              "dispatch_streaming_last_batch_age_seconds": "fold_batch_age_s"}  # fmt: skip
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            key = wanted[name]
            found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def _held(url: str, admin_key: str) -> dict[str, int]:
    """Jobs the leader holds, by status."""
    answer = httpx.get(f"{url}/v1/overview", params={"limit": 1}, timeout=10,
                       headers={"Authorization": f"Bearer {admin_key}"})  # fmt: skip
    answer.raise_for_status()
    counts: dict[str, int] = answer.json()["counts"]
    return counts


def _leader_url(stack: LocalStack) -> tuple[str, dict[str, str]]:
    """The leader's URL, and each node's name in the report by its process name."""
    roles, leader = {}, None
    for node in stack.nodes:
        answer = httpx.get(f"{node.url}/readyz", timeout=5).json()
        if answer["role"] == "leader":
            leader = node.url
            roles[node.process.name] = "leader node"
        else:
            roles[node.process.name] = "standby node"
    if leader is None:
        raise RuntimeError("no node leads")
    return leader, roles


def _wait_for_fold(url: str, timeout_s: float) -> float:
    """Until the fold has committed its first batch; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        with contextlib.suppress(httpx.HTTPError):
            if _metrics(url).get("fold_batch_age_s", -1.0) >= 0:
                return time.monotonic() - started
        time.sleep(1.0)
    raise RuntimeError(f"the fold committed no batch in {timeout_s:.0f} s")


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs (None with fewer than 3 points or no spread)."""
    if len(xs) < 3:
        return None
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


@dataclass(frozen=True)
class Options:
    rate: float
    minutes: float
    sample_s: float
    batch: int
    clients: int
    connections: int
    payload_bytes: int
    standby: bool
    settle_s: float


def _sample_line(sample: dict[str, Any]) -> str:
    rss = " ".join(f"{name}={value:.0f}" for name, value in sample["rss_mb"].items())
    held = sample.get("held", {})
    return (
        f"  t={sample['t']:6.0f}s submitted={sample['submitted']:>7} "
        f"completed={sample['completed']:>7} behind={sample['behind_s']:5.2f}s "
        f"held={sum(held.values()):>7} (succeeded {held.get('succeeded', 0)}) "
        f"fold_lag={sample.get('fold_lag_records', 0):.0f} | RSS MB {rss}"
    )


def run_variant(variant: str, options: Options) -> dict[str, Any]:
    """One variant on a fresh stack; its figures."""
    with tempfile.TemporaryDirectory(prefix=f"memory-bench-{variant}-") as scratch:
        var = Path(scratch) / "var"
        ports = [free_port(), free_port()] if options.standby else [free_port()]
        settings = load_settings(
            paths={"var": str(var), "warehouse": str(var / "delta")},
            kafka={"bootstrap": f"127.0.0.1:{free_port()}", "controller_port": free_port()},
            api={"ports": ports},
            dispatcher={**VARIANTS[variant], "default_cap": DEFAULT_CAP},
        )
        run = VariantRun(variant, settings, options, Path(scratch))
        try:
            run.start()
            run.load()
        finally:
            run.stop()
        return run.figures()


class VariantRun:
    """A fresh stack, the load on it, the samples."""

    def __init__(self, variant: str, settings: Settings, options: Options, scratch: Path) -> None:
        self.variant, self.settings, self.options, self.scratch = (
            variant, settings, options, scratch
        )  # fmt: skip
        self.stack = LocalStack(settings, StackPlan(streaming=True, workers=0))
        self.load_processes: list[LoadProcess] = []
        self.roots: dict[str, int] = {}
        """The processes measured, by their name in the report."""
        self.samples: list[dict[str, Any]] = []
        self.readings: list[Reading] = []
        self.notes: dict[str, Any] = {}

    def start(self) -> None:
        """The stack, settled, with the workers connected."""
        from dispatch.auth import ensure_dev_keys

        up_started = time.monotonic()
        self.stack.up()
        self.notes["stack_up_s"] = round(time.monotonic() - up_started, 1)
        self.leader, roles = _leader_url(self.stack)
        time.sleep(self.options.settle_s)
        self.notes["fold_first_batch_wait_s"] = round(
            _wait_for_fold(self.leader, FIRST_BATCH_TIMEOUT_S), 1
        )
        self.keys = ensure_dev_keys(self.settings.auth)
        for status in self.stack.status():
            if status.pid is not None:
                name = roles.get(status.name, status.name)
                self.roots["fold driver" if name == "streaming" else name] = status.pid
        self.workers = self._spawn(
            "workers", "work",
            {"url": self.leader, "key": self.keys["worker"],
             "connections": self.options.connections, "credit": 512},
        )  # fmt: skip
        self.workers.wait_for("ready", 30)
        self.roots["workers (bench)"] = self.workers.pid

    def _spawn(self, name: str, role: str, plan: dict[str, Any]) -> LoadProcess:
        process = LoadProcess(name, role, plan, self.scratch / f"{name}.log")
        self.load_processes.append(process)
        return process

    def load(self) -> None:
        """Submit for `minutes`, sampling; then wait for every job to complete."""
        options = self.options
        host, _, port = self.leader.removeprefix("http://").partition(":")
        seconds = options.minutes * 60
        self.submitter = self._spawn(
            "submitters", "submit",
            {"host": host, "port": int(port), "key": self.keys["client"], "rate": options.rate,
             "seconds": seconds, "batch": options.batch, "clients": options.clients,
             "payload_bytes": options.payload_bytes, "prefix": f"mem-{self.variant}"},
        )  # fmt: skip
        self.roots["submitters (bench)"] = self.submitter.pid
        self.machine_before = machine()
        self.started = time.monotonic()
        self.first = read_processes(self.roots)
        print(f"[{self.variant}] load: {options.rate:g} jobs/s for {seconds:.0f} s; {self.notes}",
              flush=True)  # fmt: skip
        self._take("load")
        next_at = options.sample_s
        while not self.submitter.latest.get("done"):
            self.submitter.check()
            self.workers.check()
            if time.monotonic() - self.started >= next_at:
                self._take("load")
                next_at += options.sample_s
            time.sleep(0.2)
        self.load_s = float(self.submitter.latest["seconds"])
        self.end_of_load = self._take("end of load")
        drain_started = time.monotonic()
        while _metrics(self.leader).get("completed", 0) < self.end_of_load["submitted"]:
            self.workers.check()
            if time.monotonic() - drain_started > DRAIN_TIMEOUT_S:
                print(f"[{self.variant}] not every job completed {DRAIN_TIMEOUT_S:.0f} s after "
                      "the load", flush=True)  # fmt: skip
                break
            time.sleep(0.5)
        self.drained = self._take("drained")
        self.elapsed = time.monotonic() - self.started
        self.machine_after = machine()
        self.terms = httpx.get(f"{self.leader}/readyz", timeout=5).json()["terms"]

    def _take(self, phase: str) -> dict[str, Any]:
        reading = read_processes(self.roots)
        metrics = _metrics(self.leader)
        progress = self.submitter.latest
        sample = {
            "t": round(time.monotonic() - self.started, 1),
            "phase": phase,
            "submitted": progress.get("submitted", 0),
            "completed": int(metrics.get("completed", 0)),
            "completed_by_workers": self.workers.latest.get("completed", 0),
            "behind_s": progress.get("behind_s", 0.0),
            "queued": int(metrics.get("queued", 0)),
            "running": int(metrics.get("running", 0)),
            "fold_lag_records": metrics.get("fold_lag_records", 0.0),
            "held": _held(self.leader, self.keys["admin"]),
            "rss_mb": {name: round(value / MB, 1) for name, value in reading.rss.items()},
        }
        self.samples.append(sample)
        self.readings.append(reading)
        print(f"[{self.variant}]" + _sample_line(sample), flush=True)
        return sample

    def stop(self) -> None:
        """The load's processes, then the stack, each by its pid."""
        try:
            for process in reversed(self.load_processes):
                process.stop()
        finally:
            self.stack.down()

    def figures(self) -> dict[str, Any]:
        end = self.end_of_load
        tail = [s for s in self.samples if s["phase"] != "drained" and s["t"] >= end["t"] / 2]
        leader_rss = [sample["rss_mb"]["leader node"] for sample in tail]
        per_minute = slope([sample["t"] / 60 for sample in tail], leader_rss)
        per_job = slope([float(sample["completed"]) for sample in tail], leader_rss)
        completed = self.drained["completed"]
        first, last = self.first, self.readings[-1]
        names = list(self.roots)
        table = {}
        for name in sorted(set(first.rss) | set(last.rss), key=lambda name: _order(name, names)):
            cpu = last.cpu.get(name, 0.0) - first.cpu.get(name, 0.0)
            table[name] = {
                "rss_start_mb": round(first.rss.get(name, 0) / MB, 1),
                "rss_end_of_load_mb": end["rss_mb"].get(name),
                "rss_max_mb": max(sample["rss_mb"].get(name, 0.0) for sample in self.samples),
                "rss_slope_last_half_mb_per_min": _rounded(
                    slope(
                        [sample["t"] / 60 for sample in tail],
                        [sample["rss_mb"].get(name, 0.0) for sample in tail],
                    ),
                    2,
                ),
                "cpu_s": round(cpu, 1),
                "cpu_s_per_1000_jobs": round(1000 * cpu / completed, 3) if completed else None,
            }
        dispatcher = self.settings.dispatcher
        submitter = self.submitter.latest
        return {
            "variant": self.variant,
            "dispatcher": {
                "finished_window_s": dispatcher.finished_window_s,
                "finished_max": dispatcher.finished_max,
                "dedup_filter_mb": dispatcher.dedup_filter_mb,
                "default_cap": dispatcher.default_cap,
            },
            **self.notes,
            "rate_asked": self.options.rate,
            "load_seconds": round(self.load_s, 1),
            "submitted": end["submitted"],
            "refused": submitter.get("refused", 0),
            "existing": submitter.get("existing", 0),
            "submit_rate": round(end["submitted"] / self.load_s, 1),
            "behind_max_s": submitter.get("behind_max_s"),
            "completed": completed,
            "completed_rate": round(completed / self.elapsed, 1),
            "completed_at_end_of_load": end["completed"],
            "leader_terms": self.terms,
            "leader_slope_last_half_mb_per_min": _rounded(per_minute, 2),
            "leader_slope_last_half_kb_per_job": _rounded(
                None if per_job is None else per_job * 1024, 3
            ),
            "last_half_samples": len(tail),
            "processes": table,
            "samples": self.samples,
            "machine_before": self.machine_before,
            "machine_after": self.machine_after,
            "steal_percent": steal_percent(self.machine_before, self.machine_after),
        }


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _order(name: str, names: list[str]) -> tuple[int, str]:
    base = name.removesuffix(" children")
    return (names.index(base) if base in names else len(names), name)


def print_report(results: dict[str, dict[str, Any]]) -> None:
    for variant, result in results.items():
        print(f"\n== {variant}: finished_window_s={result['dispatcher']['finished_window_s']:g} "
              f"finished_max={result['dispatcher']['finished_max']}")  # fmt: skip
        print(f"submitted {result['submitted']} in {result['load_seconds']} s = "
              f"{result['submit_rate']} jobs/s (asked {result['rate_asked']:g}; "
              f"schedule at most {result['behind_max_s']} s behind; refused "
              f"{result['refused']}); completed {result['completed']}")  # fmt: skip
        print(
            f"leader RSS slope, last half ({result['last_half_samples']} samples): "
            f"{result['leader_slope_last_half_mb_per_min']} MB/min, "
            f"{result['leader_slope_last_half_kb_per_job']} KB per completed job"
        )
        print(
            f"{'process':28} {'start MB':>9} {'end MB':>8} {'max MB':>8} "
            f"{'MB/min, 2nd half':>17} {'CPU s/1k jobs':>14}"
        )
        for name, row in result["processes"].items():
            per_1000 = row["cpu_s_per_1000_jobs"]
            per_minute = row["rss_slope_last_half_mb_per_min"]
            print(
                f"{name:28} {row['rss_start_mb']:9.0f} {row['rss_end_of_load_mb'] or 0:8.0f} "
                f"{row['rss_max_mb']:8.0f} {per_minute if per_minute is not None else '-':>17} "
                f"{per_1000 if per_1000 is not None else '-':>14}"
            )


@contextlib.contextmanager
def _interrupt_message() -> Iterator[None]:
    try:
        yield
    except KeyboardInterrupt:
        print("interrupted: the stack and the load were stopped", file=sys.stderr)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=500.0, help="jobs/s submitted")
    parser.add_argument("--minutes", type=float, default=10.0, help="of load, per variant")
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--only", choices=sorted(VARIANTS), help="run one variant")
    parser.add_argument("--out", type=Path, help="write the JSON report here too")
    parser.add_argument("--batch", type=int, default=50, help="jobs per POST /v1/jobs:batch")
    parser.add_argument("--clients", type=int, default=4, help="submitting connections")
    parser.add_argument("--connections", type=int, default=2, help="worker connections")
    parser.add_argument("--payload-bytes", type=int, default=64)
    parser.add_argument("--standby", action="store_true", help="run a standby node too")
    parser.add_argument("--settle-s", type=float, default=SETTLE_S)
    parser.add_argument("--role", choices=("submit", "work"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        return _load_main(args.role)
    options = Options(rate=args.rate, minutes=args.minutes, sample_s=args.sample_s,
                      batch=args.batch, clients=args.clients, connections=args.connections,
                      payload_bytes=args.payload_bytes, standby=args.standby,
                      settle_s=args.settle_s)  # fmt: skip
    variants = [args.only] if args.only else ["new", "old"]
    results: dict[str, dict[str, Any]] = {}
    with sigterm_unwinds(), _interrupt_message():
        for variant in variants:
            results[variant] = run_variant(variant, options)
    print_report(results)
    report = {"command": " ".join(sys.argv), "options": options.__dict__, "variants": results}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    summary = {variant: {key: value for key, value in result.items()
                         if key not in ("samples", "machine_before", "machine_after")}
               for variant, result in results.items()}  # fmt: skip
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

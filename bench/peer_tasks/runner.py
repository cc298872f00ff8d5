"""Runs one peer of `dispatch.bench.peers` (Celery or Dramatiq) on Redis and measures it.

Only the standard library at module level: celery, dramatiq and redis-py are imported when a
peer runs, so `dispatch.bench.peers` (and its tests) import this anywhere. The protocol is in
`bench/peers.py`'s docstring.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatch.bench.peer_tasks import (
    CELERY_PREFETCH_MULTIPLIER,
    DONE_KEY,
    EXPECTED_ENV,
    FINISHED_KEY,
    READY_KEY,
    REDIS_URL_ENV,
)
from dispatch.bench.peer_tasks.redis_server import RedisBinary, redis_server
from dispatch.bench.process_cpu import CpuReport, CpuWindow, Watched, find_child

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 120.0
STALL_TIMEOUT_S = 60.0
"""A run fails when no task completed for this long."""
STOP_TIMEOUT_S = 20.0

Send = Callable[[], object]


@dataclass(frozen=True)
class PeerResult:
    name: str
    workers: str
    e2e_jobs_per_s: float | None = None
    e2e_seconds: float | None = None
    e2e_submit_per_s: float | None = None
    """The submit loop's rate during the end-to-end run (the workers competing for the CPU)."""
    completed: int | None = None
    """Completions counted in the end-to-end run (more than --jobs: some ran twice)."""
    enqueue_per_s: float | None = None
    enqueue_seconds: float | None = None
    error: str | None = None
    cpu: CpuReport | None = None
    """CPU per job by process over the end-to-end run (`dispatch.bench.process_cpu`)."""


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class PeerFailure(RuntimeError):
    """A peer's run went wrong; the message holds the worker log's tail."""


@dataclass(frozen=True)
class Peer:
    name: str
    workers: str
    worker_argv: list[str]
    processes: int
    """Worker processes that must report ready before the clock starts."""
    sender: Callable[[str], contextlib.AbstractContextManager[Send]]


@contextlib.contextmanager
def celery_sender(url: str) -> Iterator[Send]:
    from dispatch.bench.peer_tasks.celery_app import TASK_NAME, make_app

    app = make_app(url)
    try:
        yield app.tasks[TASK_NAME].apply_async
    finally:
        app.close()


@contextlib.contextmanager
def dramatiq_sender(url: str) -> Iterator[Send]:
    from dispatch.bench.peer_tasks.dramatiq_app import make_broker

    broker, noop = make_broker(url)
    try:
        yield noop.send
    finally:
        broker.close()


PEERS = [
    Peer(
        "Celery",
        f"prefork concurrency 2, acks late, prefetch x{CELERY_PREFETCH_MULTIPLIER}",
        [
            sys.executable, "-m", "celery", "-A", "dispatch.bench.peer_tasks.celery_app", "worker",
            "--pool", "prefork", "--concurrency", "2", "--loglevel", "WARNING",
            # Cluster chatter between workers: none of it is on a task's path.
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ],
        processes=1,  # worker_ready fires once, in the parent, when the pool has started
        sender=celery_sender,
    ),
    Peer(
        "Dramatiq",
        "2 processes x 8 threads, acks after processing",
        [
            sys.executable, "-m", "dramatiq", "dispatch.bench.peer_tasks.dramatiq_app:broker",
            "--processes", "2", "--threads", "8",
        ],
        processes=2,
        sender=dramatiq_sender,
    ),
]  # fmt: skip


def timed_loop(send: Send, jobs: int) -> float:
    start = time.perf_counter()
    for _ in range(jobs):
        send()
    return time.perf_counter() - start


@contextlib.contextmanager
def workers(peer: Peer, url: str, jobs: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The peer's worker processes, in a group of their own, stopped by the group's id."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, REDIS_URL_ENV: url, EXPECTED_ENV: str(jobs), "PYTHONPATH": path}
    with log.open("wb") as out:
        process = subprocess.Popen(
            peer.worker_argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        yield process
    finally:
        # start_new_session made the worker the leader of a new group: its pid is the group's.
        for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        # A pool process that outlived its parent is still in the group (which keeps the
        # group's id from being reused): sweep it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def peer_processes(peer: Peer, url: str, workers_pid: int) -> list[Watched]:
    """What runs a peer's end-to-end run: its redis-server (a child of this process, found by
    its port), the worker processes (each a row) and this process (the submit loop)."""
    port = url.rsplit(":", 1)[1].split("/", 1)[0]
    # Its command line once it has rewritten its title, or before.
    redis_pid = find_child(os.getpid(), "redis-server", f":{port}", f"--port {port}")
    return [
        *([Watched("redis-server", redis_pid)] if redis_pid is not None else []),
        Watched(f"{peer.name.lower()} worker", workers_pid, "split"),
        Watched("producer loop (the bench process)", os.getpid(), "own"),
    ]


def _check_alive(process: subprocess.Popen[bytes], log: Path, what: str) -> None:
    if process.poll() is not None:
        output = tail(log.read_text(errors="replace"))
        raise PeerFailure(f"the workers exited ({process.returncode}) {what}: {output}")


def _wait_ready(client: Any, peer: Peer, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while client.scard(READY_KEY) < peer.processes:
        _check_alive(process, log, "before they were ready")
        if time.monotonic() > deadline:
            raise PeerFailure(f"workers not ready in {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.05)


def _wait_finished(client: Any, jobs: int, process: subprocess.Popen[bytes], log: Path) -> float:
    """When the last task completed (its own `time.time()` stamp); fails on a stall."""
    done, moved_at = 0, time.monotonic()
    while (finished := client.get(FINISHED_KEY)) is None:
        _check_alive(process, log, f"after {done} of {jobs} completions")
        now_done = int(client.get(DONE_KEY) or 0)
        if now_done != done:
            done, moved_at = now_done, time.monotonic()
        elif time.monotonic() - moved_at > STALL_TIMEOUT_S:
            raise PeerFailure(f"{done} of {jobs} completed, then none for {STALL_TIMEOUT_S:.0f} s")
        time.sleep(0.02)
    return float(finished)


def run_peer(peer: Peer, binary: RedisBinary, jobs: int) -> PeerResult:
    """Enqueue only (no worker), then end to end (workers running): a fresh Redis for each."""
    import redis

    with redis_server(binary) as url, peer.sender(url) as send:
        enqueue_s = timed_loop(send, jobs)
    with (
        tempfile.TemporaryDirectory(prefix="dispatch-peers-") as scratch,
        redis_server(binary) as url,
        peer.sender(url) as send,
        workers(peer, url, jobs, log := Path(scratch) / "workers.log") as process,
    ):
        # Any: redis-py types the replies of its sync and async clients alike (`Awaitable |
        # Any`), and without the extra installed (CI) the module is Any anyway.
        client: Any = redis.Redis.from_url(url)
        try:
            _wait_ready(client, peer, process, log)
            window = CpuWindow(peer_processes(peer, url, process.pid))
            window.start()
            # The wall clock, not a monotonic one: the last task stamps time.time() in its
            # own process.
            start = time.time()
            submit_s = timed_loop(send, jobs)
            finished = _wait_finished(client, jobs, process, log)
            window.stop()
            completed = int(client.get(DONE_KEY) or 0)
        finally:
            client.close()
    seconds = finished - start
    return PeerResult(
        peer.name,
        peer.workers,
        e2e_jobs_per_s=round(jobs / seconds, 1),
        e2e_seconds=round(seconds, 3),
        e2e_submit_per_s=round(jobs / submit_s, 1),
        completed=completed,
        enqueue_per_s=round(jobs / enqueue_s, 1),
        enqueue_seconds=round(enqueue_s, 3),
        cpu=window.report(jobs),
    )


def run_peers(binary: RedisBinary, jobs: int) -> list[PeerResult]:
    results = []
    for peer in PEERS:
        try:
            results.append(run_peer(peer, binary, jobs))
        # Any failure of a peer (its library, its workers, Redis) is reported in its column,
        # with the other peer's and dispatch's figures still printed beside it.
        except Exception as error:  # noqa: BLE001
            results.append(
                PeerResult(peer.name, peer.workers, error=f"{type(error).__name__}: {error}")
            )
    return results

"""API nodes and REST workers as real processes and threads, for the crash and failover tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from dispatch.bench.harness_load import AckingWorkers
from dispatch.settings import Settings, to_environment

DISPATCH = str(Path(sys.executable).parent / "dispatch")


class ServiceProcess:
    """`dispatch serve` as a real process of its own."""

    def __init__(self, settings: Settings, port: int, log_file: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.settings = settings
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, wait_ready: bool = True, timeout_s: float = 60.0) -> None:
        """Start; wait until it leads (`wait_ready`) or merely answers (a standby)."""
        self.launch()
        self.wait("/readyz" if wait_ready else "/healthz", timeout_s)

    def launch(self) -> None:
        """Start the process without waiting for it to answer."""
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                [DISPATCH, "serve", "--port", str(self.port)],
                env={**os.environ, **to_environment(self.settings)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait(self, path: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            assert self.process.poll() is None, self.log_tail()
            if self.answers(path):
                return
            time.sleep(0.1)
        raise AssertionError(f"{path} not 200 in {timeout_s:.0f} s:\n{self.log_tail()}")

    def answers(self, path: str) -> bool:
        try:
            return httpx.get(f"{self.url}{path}", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def readiness(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.url}/readyz", timeout=5).json()
        return body

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_file.read_text(errors="replace")[-chars:] if self.log_file.exists() else ""

    def signal(self, signum: signal.Signals) -> None:
        assert self.process is not None and self.process.poll() is None
        os.kill(self.process.pid, signum)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # A stopped process dies of SIGKILL too; no SIGCONT needed.
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # in case a test left it stopped
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def killable_service(settings: Settings, log_file: Path) -> Iterator[ServiceProcess]:
    """A node in a process of its own (so a test can kill it -9), stopped at the end
    whatever happens; not started (the test calls `start`)."""
    from dispatch.auth import ensure_dev_keys
    from dispatch.stack.ports import free_port

    ensure_dev_keys(settings.auth)
    process = ServiceProcess(settings, free_port(), log_file)
    try:
        yield process
    finally:
        process.stop()


def service_client(service: ServiceProcess, role: str) -> httpx.Client:
    """An HTTP client of `service` with the development key of `role`."""
    from dispatch.auth import ensure_dev_keys

    key = ensure_dev_keys(service.settings.auth)[role]
    return httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def start_a_pair(
    one: ServiceProcess, other: ServiceProcess, timeout_s: float = 60.0
) -> tuple[ServiceProcess, ServiceProcess]:
    """Both nodes at once, so their starts overlap; returns (the leader, the follower) once
    one leads (it took the lease first) and the other answers."""
    one.launch()
    other.launch()
    deadline = time.monotonic() + timeout_s
    while True:
        for leader, follower in ((one, other), (other, one)):
            if leader.answers("/readyz"):
                follower.wait("/healthz", max(1.0, deadline - time.monotonic()))
                return leader, follower
        for node in (one, other):
            assert node.process is not None and node.process.poll() is None, node.log_tail()
        assert time.monotonic() < deadline, f"no node leads after {timeout_s:.0f} s"
        time.sleep(0.1)


class Workers(AckingWorkers):
    """REST workers that ack everything, riding out the leader's absence: they follow 307s
    and move to the next node when one does not answer, as the SDK does (the failover
    benchmark's workers, 20 credits a poll)."""

    def __init__(self, urls: Sequence[str], key: str, count: int) -> None:
        super().__init__(urls, key, count, credits=20)

"""API nodes and REST workers as real processes and threads, for the crash and failover tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

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
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                [DISPATCH, "serve", "--port", str(self.port)],
                env={**os.environ, **to_environment(self.settings)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.wait("/readyz" if wait_ready else "/healthz", timeout_s)

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


class Workers:
    """REST workers that ack everything, riding out the leader's absence: they follow 307s
    and move to the next node when one does not answer, as the SDK does."""

    def __init__(self, urls: Sequence[str], key: str, count: int) -> None:
        self.urls, self.key = list(urls), key
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._work, args=(f"w{n}",)) for n in range(count)]

    def __enter__(self) -> Workers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _work(self, worker_id: str) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        turn = 0
        with httpx.Client(headers=headers, timeout=10, follow_redirects=True) as http:
            while not self.stop.is_set():
                url = self.urls[turn % len(self.urls)]
                try:
                    polled = http.post(
                        f"{url}/v1/workers/{worker_id}/poll",
                        json={"subjects": ["job.assign.>"], "credits": 20, "wait_s": 0.5},
                    )
                    if polled.status_code != 200:
                        turn += 1
                        time.sleep(0.2)
                        continue
                    assignments = polled.json()["assignments"]
                    if assignments:
                        acks = [
                            {"id": a["id"], "attempt": a["attempt"], "lease": a["lease"]}
                            for a in assignments
                        ]
                        http.post(f"{url}/v1/jobs:ack", json={"acks": acks})
                except httpx.TransportError:
                    turn += 1
                    time.sleep(0.2)  # that node is down: try the next, as the SDK would

"""The leader's write-ahead log under a crash: `kill -9` the service mid-load, start it again,
and every job accepted before the crash ends terminal, none lost, none completed twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.auth import ensure_dev_keys
from api.kafka_log import replay_events
from dispatch.core.events import Completed
from dispatch.settings import Settings, to_environment
from dispatch.stack.ports import free_port

pytestmark = pytest.mark.integration

DISPATCH = str(Path(sys.executable).parent / "dispatch")


class ServiceProcess:
    """`dispatch serve` as a real process of its own."""

    def __init__(self, settings: Settings, port: int, log_file: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.settings = settings
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                [DISPATCH, "serve", "--port", str(self.port)],
                env={**os.environ, **to_environment(self.settings)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_file.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"not ready in 60 s:\n{self.log_file.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def service(api_settings: Settings, tmp_path: Path) -> Iterator[ServiceProcess]:
    ensure_dev_keys(api_settings.auth)
    process = ServiceProcess(api_settings, free_port(), tmp_path / "service.log")
    try:
        yield process
    finally:
        process.stop()


class Workers:
    """REST workers that ack everything, riding out the leader's absence."""

    def __init__(self, url: str, key: str, count: int) -> None:
        self.url, self.key = url, key
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
        with httpx.Client(base_url=self.url, headers=headers, timeout=10) as http:
            while not self.stop.is_set():
                try:
                    polled = http.post(
                        f"/v1/workers/{worker_id}/poll",
                        json={"subjects": ["job.assign.>"], "credits": 20, "wait_s": 0.5},
                    )
                    if polled.status_code != 200:
                        time.sleep(0.2)
                        continue
                    assignments = polled.json()["assignments"]
                    if assignments:
                        acks = [
                            {"id": a["id"], "attempt": a["attempt"], "lease": a["lease"]}
                            for a in assignments
                        ]
                        http.post("/v1/jobs:ack", json={"acks": acks})
                except httpx.TransportError:
                    time.sleep(0.2)  # the leader is down: try again, as the SDK would


def test_kill_9_mid_load_loses_nothing_and_completes_nothing_twice(service: ServiceProcess) -> None:
    service.start()
    keys = ensure_dev_keys(service.settings.auth)
    accepted: list[str] = []
    with (
        Workers(service.url, keys["worker"], count=2),
        httpx.Client(
            base_url=service.url, headers={"Authorization": f"Bearer {keys['client']}"}, timeout=10
        ) as client,
    ):
        for batch in range(20):
            jobs = [{"id": f"c{batch}-{n}", "exec": "crash.test"} for n in range(50)]
            answer = client.post("/v1/jobs:batch", json={"jobs": jobs})
            assert answer.status_code == 202
            accepted += [job["id"] for job in answer.json()["jobs"]]
            if batch == 10:
                service.kill()
                service.start()
        deadline = time.monotonic() + 90
        pending = set(accepted)
        while pending:
            assert time.monotonic() < deadline, f"{len(pending)} jobs never finished"
            for job_id in list(pending)[:200]:
                answer = client.get(f"/v1/jobs/{job_id}")
                if answer.status_code == 200 and answer.json()["status"] == "succeeded":
                    pending.discard(job_id)
            time.sleep(0.2)

    completions = Counter(
        event.job_id
        for batch in replay_events(service.settings.kafka, client_id="crash-test-audit")
        for event in batch.events
        if isinstance(event, Completed)
    )
    assert set(completions) == set(accepted)
    assert max(completions.values()) == 1, "a job completed twice"

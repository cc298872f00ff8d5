"""A leader and a follower as real processes (`dispatch serve`), their output in log files, for
the hostile-input suite: each fuzzing module gets a stack of its own and checks, at its end,
that neither node wrote a traceback and that the leader still works."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatch.auth import ensure_dev_keys
from dispatch.settings import Settings, with_namespace
from dispatch.stack.broker import Broker, create_topics
from dispatch.stack.ports import free_port
from tests.integration.api.conftest import short_timeouts
from tests.integration.api.processes import ServiceProcess, start_a_pair

_stacks = itertools.count(1)
PROJECT = str(Path(__file__).resolve().parents[3])
"""The repository root: a traceback is summarised by its last frame in the project."""


@dataclass
class HostileStack:
    settings: Settings
    leader: ServiceProcess
    follower: ServiceProcess
    keys: dict[str, str]
    folder: Path

    def headers(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[role]}"}

    def client(self, role: str = "admin", *, node: str = "leader") -> httpx.Client:
        url = self.leader.url if node == "leader" else self.follower.url
        return httpx.Client(base_url=url, headers=self.headers(role), timeout=30.0)

    def epoch(self) -> int:
        answer = httpx.get(f"{self.leader.url}/readyz", timeout=10)
        assert answer.status_code == 200, f"the leader is not ready: {answer.text}"
        return int(answer.json()["epoch"])

    def tracebacks(self) -> list[str]:
        """Each traceback either node wrote since the stack started: its last line (the
        exception) and the line before it (where it was raised)."""
        found = []
        for process in (self.leader, self.follower):
            text = process.log_file.read_text(errors="replace") if process.log_file.exists() else ""
            found += [f"{process.url}: {block}" for block in traceback_summaries(text)]
        return found

    def round_trip(self, exec_name: str = "hostile.canary") -> dict[str, Any]:
        """Submit a job and work it through a REST worker: the leader still dispatches."""
        job_id = f"canary-{time.monotonic_ns()}"
        with self.client("client") as client, self.client("worker") as worker:
            submitted = client.post("/v1/jobs", json={"id": job_id, "exec": exec_name,
                                                      "payload": {"n": 1}})  # fmt: skip
            assert submitted.status_code in (200, 202), submitted.text
            deadline = time.monotonic() + 30
            subject = f"job.assign.{exec_name}"
            while time.monotonic() < deadline:
                polled = worker.post(
                    f"/v1/workers/canary-{job_id}/poll",
                    json={"subjects": [subject], "credits": 1, "wait_s": 2.0},
                )
                assert polled.status_code == 200, polled.text
                for assignment in polled.json()["assignments"]:
                    acked = worker.post(
                        f"/v1/jobs/{assignment['id']}/ack",
                        json={"attempt": assignment["attempt"], "lease": assignment["lease"],
                              "result": {"ok": True}},
                    )  # fmt: skip
                    assert acked.status_code == 200, acked.text
                job = client.get(f"/v1/jobs/{job_id}").json()
                if job.get("status") == "succeeded":
                    return dict(job)
            raise AssertionError(f"the canary {job_id} did not succeed in 30 s")


_TRACEBACK_BLOCK = re.compile(
    r"Traceback \(most recent call last\):\n(?:[ \t].*\n|\n)*?(?P<last>[^ \t\n].*)"
)


def traceback_summaries(text: str) -> list[str]:
    """The exception line of every traceback in `text`, with the frame line before it."""
    summaries = []
    for match in _TRACEBACK_BLOCK.finditer(text):
        block = match.group(0).splitlines()
        frames = [line.strip() for line in block if line.strip().startswith("File ")]
        # The project's own frame closest to the error says more than the library's.
        ours = [frame for frame in frames if PROJECT in frame and ".venv" not in frame]
        where = (ours or frames or ["?"])[-1]
        summaries.append(f"{match.group('last').strip()[:300]}  ({where})")
    return summaries


@pytest.fixture(scope="module")
def hostile_stack(
    kafka_broker: Broker, stack_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HostileStack]:
    folder = tmp_path_factory.mktemp("hostile")
    settings = short_timeouts(with_namespace(stack_settings, f"hostile{next(_stacks)}", folder))
    create_topics(settings.kafka)
    keys = ensure_dev_keys(settings.auth)
    one = ServiceProcess(settings, free_port(), folder / "node-1.log")
    other = ServiceProcess(settings, free_port(), folder / "node-2.log")
    try:
        leader, follower = start_a_pair(one, other)
        yield HostileStack(settings, leader, follower, keys, folder)
    finally:
        other.stop()
        one.stop()

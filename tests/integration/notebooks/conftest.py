"""Tables for the notebooks, made by a real run: a real API leader on the session's Kafka
broker, REST workers driven by the test (acks, retryable and permanent failures, a timeout), a
cancel, then the streaming application (available-now) folding the log into Delta. Made once
per module: every notebook reads the same tables, and the leader stays up for the redrive.

The run has two phases with a streaming run after each, so `jobs` has a past version that
differs from now (time travel):

| phase | jobs | end state |
|---|---|---|
| A | ok-1..ok-4 (img.resize), ok-5, ok-6 (mail.send) | succeeded |
| A | retry-1 (mail.send): fails once (retryable) | queued after A, succeeded after B |
| A | oom-1, oom-2 (img.resize), mail-oom-1 (mail.send): OutOfMemoryError, permanent | dead |
| A | bad-1 (img.resize): ValueError, permanent | dead |
| A | cancel-1 (mail.send, delayed an hour) | cancelled |
| A | q-1, q-2 (video.encode: no worker serves it) | queued |
| B | oom-3 (img.resize): OutOfMemoryError, permanent, after the redrive window | dead |
| B | slow-1 (report.build, 1 attempt of 1 s, never acked) | dead (ack_timeout) |
| B | flaky-1 (report.build, 2 attempts, both fail retryably) | dead (retries_exhausted) |
| B | run-1, run-2 (img.resize, on w1), run-3 (report.build, on w2), an hour to run | running |
| B | q-3 (video.encode), q-4 (report.build, after the workers' credit went to 0) | queued |
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from dispatch.delta import tables as t
from dispatch.settings import Settings
from dispatch.stack.broker import Broker, create_topics
from dispatch.streaming.app import StreamOptions
from dispatch.warehouse import Warehouse
from tests.integration.api.conftest import RunningNode, poll, poll_until, start_node
from tests.integration.streaming.conftest import namespaced, run_stream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

W1_SUBJECTS = ["job.assign.img.*", "job.assign.mail.*"]
W2_SUBJECTS = ["job.assign.report.*"]
OOM = "OutOfMemoryError: Java heap space"
LONG_S = 3600.0
"""Timeout of the jobs left running: they must not time out while the notebooks run."""

ONE_BATCH = StreamOptions(max_offsets_per_trigger=None, rollup_every_s=0, maintenance=None)
"""Each streaming run is one micro-batch (one `jobs` version per phase), stats rolled up."""

EXPECTED_STATUS: dict[str, str] = {
    **{f"ok-{n}": "succeeded" for n in range(1, 7)},
    "retry-1": "succeeded",
    **dict.fromkeys(("oom-1", "oom-2", "oom-3", "bad-1", "mail-oom-1"), "dead"),
    **dict.fromkeys(("slow-1", "flaky-1"), "dead"),
    "cancel-1": "cancelled",
    **dict.fromkeys(("run-1", "run-2", "run-3"), "running"),
    **dict.fromkeys(("q-1", "q-2", "q-3", "q-4"), "queued"),
}
EXEC_OF: dict[str, str] = {
    **{f"ok-{n}": "img.resize" for n in range(1, 5)},
    **dict.fromkeys(("ok-5", "ok-6", "retry-1", "mail-oom-1", "cancel-1"), "mail.send"),
    **dict.fromkeys(("oom-1", "oom-2", "oom-3", "bad-1", "run-1", "run-2"), "img.resize"),
    **dict.fromkeys(("slow-1", "flaky-1", "run-3", "q-4"), "report.build"),
    **dict.fromkeys(("q-1", "q-2", "q-3"), "video.encode"),
}
CLIENT_OF: dict[str, str] = {
    job_id: "globex" if job_id in {"ok-2", "ok-4", "ok-6", "oom-2", "q-4", "flaky-1"} else "acme"
    for job_id in EXPECTED_STATUS
}


@dataclass
class Produced:
    """What the run made, and what a notebook should therefore show."""

    settings: Settings
    node: RunningNode
    phase_a_started: dt.datetime
    phase_a_ended: dt.datetime
    """Every phase A job died before this, every phase B job after it."""
    version_after_a: int
    """The `jobs` version of the streaming run after phase A."""

    @property
    def warehouse(self) -> str:
        return str(self.settings.paths.warehouse)


class _Run:
    """The test's side of the run: an admin (submits for clients acme and globex, cancels)
    and one worker key polling as w1 and w2."""

    def __init__(self, admin: httpx.Client, worker: httpx.Client) -> None:
        self.admin = admin
        self.worker = worker

    def submit(self, job_id: str, **extra: Any) -> None:
        body = {"id": job_id, "exec": EXEC_OF[job_id], "client_id": CLIENT_OF[job_id]}
        answer = self.admin.post("/v1/jobs", json={**body, "payload": {"n": job_id}, **extra})
        assert answer.status_code == 202, answer.text

    def visible(self, job_id: str, timeout_s: float = 20.0) -> dict[str, Any]:
        """The job once the leader consumed its submission from Kafka."""
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self.admin.get(f"/v1/jobs/{job_id}")
            if answer.status_code == 200:
                job: dict[str, Any] = answer.json()
                return job
            assert time.monotonic() < deadline, f"{job_id} never became visible"
            time.sleep(0.05)

    def status_becomes(self, job_id: str, status: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.visible(job_id)["status"] != status:
            assert time.monotonic() < deadline, f"{job_id} never became {status}"
            time.sleep(0.1)

    def take(self, worker_id: str, subjects: list[str], count: int) -> dict[str, dict[str, Any]]:
        return {str(a["id"]): a for a in poll_until(self.worker, worker_id, subjects, count, 30.0)}

    def ack(self, job_id: str, assignment: dict[str, Any]) -> None:
        body = {"attempt": assignment["attempt"], "lease": assignment["lease"]}
        answer = self.worker.post(f"/v1/jobs/{job_id}/ack", json={**body, "result": {"ok": 1}})
        assert answer.status_code == 200, answer.text

    def fail(self, job_id: str, assignment: dict[str, Any], error: str, *, retryable: bool) -> None:
        body = {"attempt": assignment["attempt"], "lease": assignment["lease"]}
        answer = self.worker.post(
            f"/v1/jobs/{job_id}/fail", json={**body, "error": error, "retryable": retryable}
        )
        assert answer.status_code == 200, answer.text

    def no_credit(self) -> None:
        """Both workers have room for nothing: what is queued now stays queued (a redriven
        job too), so the notebooks see a fixed picture."""
        poll(self.worker, "w1", W1_SUBJECTS, credits=0, wait_s=0)
        poll(self.worker, "w2", W2_SUBJECTS, credits=0, wait_s=0)

    def phase_a(self) -> None:
        # q-1 first and alone: it is the oldest queued job, whatever order the two submit
        # partitions deliver the rest in.
        self.submit("q-1")
        self.visible("q-1")
        for job_id in (
            "ok-1", "ok-2", "ok-3", "ok-4", "ok-5", "ok-6", "retry-1", "oom-1", "oom-2",
            "bad-1", "mail-oom-1", "q-2",
        ):  # fmt: skip
            self.submit(job_id)
        self.submit("cancel-1", delay_s=LONG_S)
        self.visible("cancel-1")
        cancelled = self.admin.delete("/v1/jobs/cancel-1")
        assert cancelled.status_code == 200, cancelled.text
        taken = self.take("w1", W1_SUBJECTS, 11)
        for job_id in ("ok-1", "ok-2", "ok-3", "ok-4", "ok-5", "ok-6"):
            self.ack(job_id, taken[job_id])
        self.fail("retry-1", taken["retry-1"], "TimeoutError: upstream slow", retryable=True)
        for job_id in ("oom-1", "oom-2", "mail-oom-1"):
            self.fail(job_id, taken[job_id], OOM, retryable=False)
        self.fail("bad-1", taken["bad-1"], "ValueError: bad input 'x'", retryable=False)
        self.no_credit()

    def phase_b(self) -> None:
        self.ack("retry-1", self.take("w1", W1_SUBJECTS, 1)["retry-1"])
        self.submit("oom-3")
        self.fail("oom-3", self.take("w1", W1_SUBJECTS, 1)["oom-3"], OOM, retryable=False)
        self.submit("slow-1", max_attempts=1, timeout_s=1.0)
        self.submit("flaky-1", max_attempts=2)
        taken = self.take("w2", W2_SUBJECTS, 2)
        self.fail("flaky-1", taken["flaky-1"], "ConnectionError: reset by peer", retryable=True)
        again = self.take("w2", W2_SUBJECTS, 1)["flaky-1"]
        self.fail("flaky-1", again, "ConnectionError: reset by peer", retryable=True)
        # slow-1 is never acked: its only attempt times out into the dead-letter queue.
        self.status_becomes("slow-1", "dead")
        for job_id in ("run-1", "run-2", "run-3"):
            self.submit(job_id, timeout_s=LONG_S)
        running = {**self.take("w1", W1_SUBJECTS, 2), **self.take("w2", W2_SUBJECTS, 1)}
        assert set(running) == {"run-1", "run-2", "run-3"}
        self.no_credit()
        for job_id in ("q-3", "q-4"):
            self.submit(job_id)
            self.visible(job_id)


_numbers = itertools.count(1)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _jobs_version(settings: Settings) -> int:
    from deltalake import DeltaTable

    version: int = DeltaTable(Warehouse.of(settings).table(t.JOBS)).version()
    return version


def notebook_settings(topics: Settings) -> Settings:
    """The run's settings: keys of its own; nothing times out or requeues by itself while the
    notebooks run (long worker expiry and ack timeouts; slow-1's timeout is explicit); a
    lease renewed every few seconds rather than twice a second (each renewal is a Delta
    commit, and the notebooks' Spark needs the two cores)."""
    return topics.model_copy(
        update={
            "auth": topics.auth.model_copy(
                update={
                    "keys_file": topics.paths.var / "api-keys.json",
                    "dev_keys_file": topics.paths.var / "dev-keys.json",
                }
            ),
            "dispatcher": topics.dispatcher.model_copy(
                update={
                    "ack_timeout_s": 60.0,
                    "max_ack_timeout_s": 120.0,
                    "max_attempts": 3,
                    "worker_expiry_s": LONG_S,
                }
            ),
            "lease": topics.lease.model_copy(
                update={"ttl_s": 30.0, "renew_every_s": 5.0, "clock_skew_margin_s": 2.0}
            ),
        }
    )


def play(node: RunningNode, spark: SparkSession) -> Produced:
    """The two phases, each followed by a streaming run; the node stays up."""
    settings = node.settings
    with node.client("admin") as admin, node.client("worker") as worker:
        run = _Run(admin, worker)
        started = _utc_now()
        run.phase_a()
        ended = _utc_now()
        run_stream(settings, spark, ONE_BATCH)
        version_after_a = _jobs_version(settings)
        run.phase_b()
        run_stream(settings, spark, ONE_BATCH)
    return Produced(settings, node, started, ended, version_after_a)


@pytest.fixture(scope="module")
def produced(
    kafka_broker: Broker,
    stack_settings: Settings,
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Produced]:
    base = tmp_path_factory.mktemp(f"notebooks{next(_numbers)}")
    settings = notebook_settings(namespaced(stack_settings, base, "notebooks"))
    create_topics(settings.kafka)
    node, server, thread = start_node(settings)
    try:
        yield play(node, spark)
    finally:
        server.should_exit = True
        thread.join(30)

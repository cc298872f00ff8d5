"""Retry delays and expiry, seen by a worker and a client of a real node."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dispatch.api.memory_log import MemoryLog
from dispatch.settings import Settings
from tests.integration.api.conftest import RunningNode, poll, poll_until, start_node, stop_node
from tests.integration.api.processes import ServiceProcess, killable_service, service_client

pytestmark = pytest.mark.integration

DELAY_S = 2.0


def with_retry_delay(settings: Settings) -> Settings:
    """A first retry delay of DELAY_S, doubling, no jitter (so a test knows the time)."""
    dispatcher = settings.dispatcher.model_copy(
        update={"retry_delay_s": DELAY_S, "retry_multiplier": 2.0, "retry_jitter": 0.0}
    )
    return settings.model_copy(update={"dispatcher": dispatcher})


@pytest.fixture
def retry_node(api_settings: Settings) -> Iterator[RunningNode]:
    """A leading node on the in-memory log whose failed attempts wait DELAY_S."""
    settings = with_retry_delay(api_settings)
    running, server, thread = start_node(settings, io=MemoryLog(settings))
    try:
        yield running
    finally:
        stop_node(server, thread)


@pytest.fixture
def broker_retry_node(broker_api_settings: Settings) -> Iterator[RunningNode]:
    """The same on the session's Kafka broker."""
    settings = with_retry_delay(broker_api_settings)
    running, server, thread = start_node(settings)
    try:
        yield running
    finally:
        stop_node(server, thread)


def fail(worker: httpx.Client, assignment: dict[str, object], **extra: object) -> httpx.Response:
    return worker.post(
        f"/v1/jobs/{assignment['id']}/fail",
        json={"attempt": assignment["attempt"], "lease": assignment["lease"], "error": "db down"}
        | extra,
    )


def check_next_attempt_waits(node: RunningNode) -> None:
    with node.client("client") as client, node.client("worker") as worker:
        assert client.post("/v1/jobs", json={"id": "r1", "exec": "a.b"}).status_code == 202
        [first] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        failed_at = time.time()
        answer = fail(worker, first)
        assert answer.status_code == 200 and answer.json()["status"] == "retrying", answer.text

        job = client.get("/v1/jobs/r1").json()
        assert job["status"] == "retrying" and job["error"] == "db down"
        assert failed_at - 0.5 < job["next_attempt_at"] - DELAY_S < time.time() + 0.5

        # The worker has room and asks at once: nothing until the delay has passed.
        started = time.monotonic()
        assert poll(worker, "w1", ["job.assign.a.b"], credits=1, wait_s=DELAY_S - 0.7) == []
        [second] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        assert second["attempt"] == 2
        assert time.time() >= job["next_attempt_at"] - 0.05
        assert time.monotonic() - started >= DELAY_S - 0.6
        assert client.get("/v1/jobs/r1").json()["status"] == "running"


def test_a_failed_attempt_comes_back_only_after_its_delay(retry_node: RunningNode) -> None:
    check_next_attempt_waits(retry_node)


def test_a_failed_attempt_comes_back_only_after_its_delay_on_a_broker(
    broker_retry_node: RunningNode,
) -> None:
    check_next_attempt_waits(broker_retry_node)


def test_a_worker_s_own_delay_wins_and_a_bad_one_is_refused(retry_node: RunningNode) -> None:
    with retry_node.client("client") as client, retry_node.client("worker") as worker:
        client.post("/v1/jobs", json={"id": "r2", "exec": "a.b"})
        [first] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        refused = fail(worker, first, retry_after_s=-1)
        assert refused.status_code == 422 and "retry_after_s" in refused.text, refused.text
        assert client.get("/v1/jobs/r2").json()["status"] == "running"
        assert fail(worker, first, retry_after_s=0).status_code == 200
        [second] = poll_until(worker, "w1", ["job.assign.a.b"], 1, timeout_s=DELAY_S - 0.5)
        assert second["attempt"] == 2, "retry_after_s=0: again at once"


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"retry": {"delay_s": -1}}, "retry.delay_s"),
        ({"retry": {"multiplier": 0.5}}, "retry.multiplier"),
        ({"retry": {"later": 1}}, "later"),
        ({"ttl_s": -3}, "ttl_s"),
        ({"ttl_s": 5, "expires_at": 2e9}, "ttl_s"),
    ],
)
def test_a_bad_policy_or_expiry_is_refused_with_422_naming_the_field(
    retry_node: RunningNode, body: dict[str, object], named: str
) -> None:
    with retry_node.client("client") as client:
        answer = client.post("/v1/jobs", json={"id": "bad", "exec": "a.b"} | body)
        assert answer.status_code == 422 and named in answer.text, answer.text


def test_a_job_s_own_policy_sets_its_delay(retry_node: RunningNode) -> None:
    with retry_node.client("client") as client, retry_node.client("worker") as worker:
        body = {"id": "r3", "exec": "a.b", "retry": {"delay_s": 30}}
        assert client.post("/v1/jobs", json=body).status_code == 202
        [first] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        failed_at = time.time()
        fail(worker, first)
        job = client.get("/v1/jobs/r3").json()
        assert 29 < job["next_attempt_at"] - failed_at < 31


def check_an_expired_job_never_runs(node: RunningNode) -> None:
    with node.client("client") as client, node.client("worker") as worker:
        assert client.post("/v1/jobs", json={"id": "e1", "exec": "a.b", "ttl_s": 0.5}).is_success
        assert client.post("/v1/jobs", json={"id": "e2", "exec": "a.b"}).is_success
        job = client.get("/v1/jobs/e1").json()
        assert job["status"] == "queued" and job["expires_at"] is not None
        time.sleep(1.0)
        job = client.get("/v1/jobs/e1", params={"wait": 5}).json()
        assert job["status"] == "expired" and "expired" in job["error"]
        got = poll(worker, "w1", ["job.assign.a.b"], credits=5, wait_s=1.0)
        assert [assignment["id"] for assignment in got] == ["e2"]


def test_an_expired_job_never_reaches_a_worker(retry_node: RunningNode) -> None:
    check_an_expired_job_never_runs(retry_node)


def test_an_expired_job_never_reaches_a_worker_on_a_broker(
    broker_retry_node: RunningNode,
) -> None:
    check_an_expired_job_never_runs(broker_retry_node)


@pytest.fixture
def retry_service(broker_api_settings: Settings, tmp_path: Path) -> Iterator[ServiceProcess]:
    """A node in a process of its own (so it can be killed -9), on the session's broker."""
    settings = with_retry_delay(broker_api_settings)
    dispatcher = settings.dispatcher.model_copy(update={"retry_delay_s": 8.0})
    settings = settings.model_copy(update={"dispatcher": dispatcher})
    with killable_service(settings, tmp_path / "service.log") as process:
        yield process


def test_a_retry_schedule_and_an_expiry_survive_a_kill_9(retry_service: ServiceProcess) -> None:
    """The new leader rebuilds from the log: the retrying job keeps its next attempt time
    (not sooner, not forgotten), and a job's expiry still ends it."""
    retry_service.start()

    def client(role: str) -> httpx.Client:
        return service_client(retry_service, role)

    with client("client") as submitter, client("worker") as worker:
        submitter.post("/v1/jobs", json={"id": "k1", "exec": "a.b"}).raise_for_status()
        [first] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        assert fail(worker, first).json()["status"] == "retrying"
        before = submitter.get("/v1/jobs/k1").json()
        # Far enough ahead that it is still waiting when the new leader is up.
        submitter.post("/v1/jobs", json={"id": "k2", "exec": "x.y", "ttl_s": 6}).raise_for_status()

    retry_service.kill()
    retry_service.start()

    with client("client") as submitter, client("worker") as worker:
        after = submitter.get("/v1/jobs/k1").json()
        assert after["status"] == "retrying"
        assert after["next_attempt_at"] == before["next_attempt_at"]
        early = poll(worker, "w2", ["job.assign.a.b"], credits=1, wait_s=0.5)
        if time.time() < before["next_attempt_at"] - 0.5:
            assert early == [], "the next attempt started before its time"
        [second] = early or poll_until(worker, "w2", ["job.assign.a.b"], 1)
        assert second["attempt"] == 2 and time.time() >= before["next_attempt_at"] - 0.05
        expired = submitter.get("/v1/jobs/k2", params={"wait": 15}).json()
        assert expired["status"] == "expired"
        assert poll(worker, "w3", ["job.assign.x.y"], credits=1, wait_s=0.5) == []

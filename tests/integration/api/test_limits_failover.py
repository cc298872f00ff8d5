"""Runtime limits across a leader's kill -9: the new leader rebuilds the limits in force from
the log, counts the jobs the old one started, and never starts one more than a limit allows;
the work moves again as soon as the limit has room."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatch.settings import Settings
from tests.integration.api.conftest import poll, poll_until
from tests.integration.api.processes import ServiceProcess, killable_service, service_client

pytestmark = pytest.mark.integration

ALL = ["job.assign.>"]


@pytest.fixture
def service(broker_api_settings: Settings, tmp_path: Path) -> Iterator[ServiceProcess]:
    with killable_service(broker_api_settings, tmp_path / "service.log") as process:
        yield process


def _ack(worker: httpx.Client, assignment: dict[str, Any]) -> None:
    answer = worker.post(
        f"/v1/jobs/{assignment['id']}/ack",
        json={"attempt": assignment["attempt"], "lease": assignment["lease"]},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "succeeded"


def test_a_key_limit_and_a_client_limit_survive_a_kill_9(service: ServiceProcess) -> None:
    """One job per account at a time, before and after the leader dies: the job the old
    leader started still counts, so its sibling waits until it is acked (with the old
    lease, to the new leader), then starts."""
    service.start()
    with service_client(service, "admin") as admin, service_client(service, "worker") as worker:
        put = admin.put("/v1/limits/key/acct:*", json={"max_inflight": 1, "reason": "one each"})
        assert put.status_code == 200, put.text
        put = admin.put("/v1/limits/client/dev", json={"max_inflight": 5, "rate": 100})
        assert put.status_code == 200, put.text
        for job_id in ("k1", "k2"):
            submitted = admin.post(
                "/v1/jobs", json={"id": job_id, "exec": "limited.job", "key": "acct:7"}
            )
            assert submitted.status_code in (200, 202), submitted.text
        [first] = poll_until(worker, "w1", ALL, 1)
        # Its sibling waits: a second slot gets nothing.
        assert poll(worker, "w1", ALL, credits=2, wait_s=0.5) == []

    service.kill()
    started = time.monotonic()
    service.start()

    with service_client(service, "admin") as admin, service_client(service, "worker") as worker:
        limits = {(v["scope"], v["target"]): v for v in admin.get("/v1/limits").json()["limits"]}
        key_limit = limits[("key", "acct:*")]
        assert (key_limit["max_inflight"], key_limit["reason"]) == (1, "one each")
        assert key_limit["by"], "the key that set it is recorded"
        assert limits[("client", "dev")]["rate"] == 100
        # The job the old leader started still holds the key's one slot.
        assert poll(worker, "w2", ALL, credits=2, wait_s=1.0) == []
        _ack(worker, first)
        [second] = poll_until(worker, "w2", ALL, 1)
        assert second["id"] == ({"k1", "k2"} - {first["id"]}).pop()
        _ack(worker, second)
        print(f"work moving again {time.monotonic() - started:.1f} s after the restart")
        removed = admin.delete("/v1/limits/key/acct:*")
        assert removed.status_code == 200 and removed.json()["removed"] is True

"""The leader's write-ahead log under a crash: `kill -9` the service mid-load, start it again,
and every job accepted before the crash ends terminal, none lost, none completed twice."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.auth import ensure_dev_keys
from api.kafka_log import replay_events
from dispatch.core.events import Completed
from dispatch.settings import Settings
from dispatch.stack.ports import free_port
from tests.integration.api.processes import ServiceProcess, Workers

pytestmark = pytest.mark.integration


@pytest.fixture
def service(api_settings: Settings, tmp_path: Path) -> Iterator[ServiceProcess]:
    ensure_dev_keys(api_settings.auth)
    process = ServiceProcess(api_settings, free_port(), tmp_path / "service.log")
    try:
        yield process
    finally:
        process.stop()


def test_kill_9_mid_load_loses_nothing_and_completes_nothing_twice(service: ServiceProcess) -> None:
    service.start()
    keys = ensure_dev_keys(service.settings.auth)
    accepted: list[str] = []
    with (
        Workers([service.url], keys["worker"], count=2),
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

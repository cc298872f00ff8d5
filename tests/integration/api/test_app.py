"""Health, readiness, metrics and the published OpenAPI document of a real node."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.api.conftest import RunningNode, poll_until

pytestmark = pytest.mark.integration


def test_health_and_readiness_need_no_key(api_node: RunningNode) -> None:
    assert httpx.get(f"{api_node.url}/healthz").json()["status"] == "ok"
    ready = httpx.get(f"{api_node.url}/readyz")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True


def test_openapi_publishes_the_contract(api_node: RunningNode) -> None:
    paths = httpx.get(f"{api_node.url}/openapi.json").json()["paths"]
    for path in (
        "/v1/jobs",
        "/v1/jobs:batch",
        "/v1/jobs/{job_id}",
        "/v1/workers/{worker_id}/poll",
        "/v1/jobs/{job_id}/ack",
        "/v1/jobs/{job_id}/fail",
        "/v1/jobs/{job_id}/heartbeat",
        "/v1/dlq",
        "/v1/dlq/{job_id}/redrive",
        "/v1/queues",
        "/v1/workers",
        "/v1/leader",
    ):
        assert path in paths, path


def test_metrics_count_what_the_leader_did(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        admin.post(
            "/v1/jobs:batch", json={"jobs": [{"id": f"m{n}", "exec": "a.b"} for n in range(3)]}
        )
        poll_until(worker, "w1", ["job.assign.>"], 3)
        leader = admin.get("/v1/leader").json()
        assert leader["is_leader"] is True and leader["epoch"] >= 1
    text = httpx.get(f"{api_node.url}/metrics").text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples["dispatch_enqueued_total"] == 3
    assert samples["dispatch_assigned_total"] == 3
    assert samples["dispatch_in_flight"] == 3
    assert samples["dispatch_is_leader"] == 1
    assert samples["dispatch_dispatch_latency_seconds_count"] == 3
    assert samples["dispatch_commit_seconds_count"] >= 1

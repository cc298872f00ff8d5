"""Health, readiness, metrics and the published OpenAPI document of a real node."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema
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


def _documented(document: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    """The schema the document gives for one answer, with the components it refers to."""
    answer = document["paths"][path][method]["responses"][str(status)]
    schema: dict[str, Any] = answer["content"]["application/json"]["schema"]
    return {**schema, "components": document["components"]}


def test_openapi_describes_the_error_bodies_the_server_really_answers(
    api_node: RunningNode,
) -> None:
    document = httpx.get(f"{api_node.url}/openapi.json").json()
    assert "HTTPValidationError" not in document["components"]["schemas"]
    with api_node.client("client") as client:
        # A 422 from request validation (with `fields`) and one from the submission checks.
        shape = client.post("/v1/jobs", json={"payload": 1})
        value = client.post("/v1/jobs", json={"exec": "a.b", "id": "a/b"})
        unknown = client.get("/v1/jobs/nope")
        forbidden = client.get("/v1/dlq")
    anonymous = httpx.get(f"{api_node.url}/v1/jobs/nope")
    answers = [
        (shape, "/v1/jobs", "post", 422),
        (value, "/v1/jobs", "post", 422),
        (unknown, "/v1/jobs/{job_id}", "get", 404),
        (forbidden, "/v1/dlq", "get", 403),
        (anonymous, "/v1/jobs/{job_id}", "get", 401),
    ]
    for answer, path, method, status in answers:
        assert answer.status_code == status, answer.text
        jsonschema.validate(answer.json(), _documented(document, path, method, status))
    assert shape.json()["fields"] == ["body.exec: Field required"]
    # FastAPI's default 422 schema (an array `detail`) would refuse the real body.
    fastapi_default = {
        "type": "object",
        "properties": {"detail": {"type": "array"}},
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(value.json(), fastapi_default)


def test_openapi_lists_every_status_a_route_can_answer(api_node: RunningNode) -> None:
    paths = httpx.get(f"{api_node.url}/openapi.json").json()["paths"]
    submit = set(paths["/v1/jobs"]["post"]["responses"])
    assert {"202", "200", "307", "400", "401", "403", "409", "413", "422", "503"} <= submit
    read = set(paths["/v1/jobs/{job_id}"]["get"]["responses"])
    assert {"200", "307", "401", "403", "404", "422", "503"} <= read
    assert paths["/v1/jobs/{job_id}"]["get"]["security"] == [{"bearer": []}]
    assert "401" not in paths["/healthz"]["get"]["responses"]

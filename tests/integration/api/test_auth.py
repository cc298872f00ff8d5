"""Every denial: no key, a wrong key, a role that may not, another client's job, and errors
that are JSON with the right status, never a 500 for bad input."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.api.conftest import RunningNode, poll_until

pytestmark = pytest.mark.integration


def test_no_key_and_an_unknown_key_are_401(api_node: RunningNode) -> None:
    anonymous = httpx.post(f"{api_node.url}/v1/jobs", json={"exec": "a.b"})
    assert anonymous.status_code == 401
    assert anonymous.json()["error"] == "unauthorized"
    forged = httpx.get(f"{api_node.url}/v1/queues", headers={"Authorization": "Bearer nope"})
    assert forged.status_code == 401


@pytest.mark.parametrize(
    ("role", "method", "path", "body"),
    [
        ("worker", "POST", "/v1/jobs", {"exec": "a.b"}),
        ("client", "POST", "/v1/workers/w1/poll", {"subjects": ["job.assign.>"], "credits": 1}),
        ("client", "POST", "/v1/jobs/x/ack", {"attempt": 1, "lease": "l"}),
        ("client", "GET", "/v1/dlq", None),
        ("client", "POST", "/v1/dlq/x/redrive", None),
        ("worker", "GET", "/v1/queues", None),
        ("client", "GET", "/v1/workers", None),
    ],
)
def test_a_role_that_may_not_is_403(
    api_node: RunningNode, role: str, method: str, path: str, body: object
) -> None:
    with api_node.client(role) as caller:
        answer = caller.request(method, path, json=body)
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"] == "forbidden"


def test_a_client_cannot_see_cancel_or_reuse_another_clients_job(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin, api_node.client("client") as client:
        admin.post("/v1/jobs", json={"id": "theirs", "exec": "a.b", "client_id": "someone-else"})
        assert admin.get("/v1/jobs/theirs", params={"wait": 0}).status_code in (200, 404)
        for _ in range(100):
            if admin.get("/v1/jobs/theirs").status_code == 200:
                break
        assert client.get("/v1/jobs/theirs").status_code == 404
        assert client.delete("/v1/jobs/theirs").status_code == 404
        assert client.post("/v1/jobs", json={"id": "theirs", "exec": "a.b"}).status_code == 409
        denied = client.post("/v1/jobs", json={"exec": "a.b", "client_id": "someone-else"})
        assert denied.status_code == 403
        assert "client_id" in denied.json()["detail"]


def test_a_worker_settles_only_the_lease_it_holds(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        admin.post("/v1/jobs", json={"id": "leased", "exec": "a.b"})
        [assignment] = poll_until(worker, "w1", ["job.assign.>"], 1)
        wrong_lease = worker.post("/v1/jobs/leased/ack", json={"attempt": 1, "lease": "forged"})
        assert wrong_lease.status_code == 409
        assert wrong_lease.json()["error"] == "stale_lease"
        wrong_worker = worker.post(
            "/v1/jobs/leased/ack",
            json={"attempt": 1, "lease": assignment["lease"], "worker_id": "w2"},
        )
        assert wrong_worker.status_code == 409
        # The batch form too: each ack is checked against the worker it names.
        batch = worker.post(
            "/v1/jobs:ack",
            json={"acks": [{"id": "leased", "attempt": 1, "lease": assignment["lease"],
                            "worker_id": "w2"}]},
        )  # fmt: skip
        assert batch.status_code == 200
        [refused] = batch.json()["results"]
        assert (refused["error"], refused["status"]) == ("stale_lease", None)
        # A worker key learns nothing about who holds a job (docs/security.md).
        assert "w1" not in refused["detail"] and "held by" not in refused["detail"]
        unknown = worker.post("/v1/jobs/nope/ack", json={"attempt": 1, "lease": "l"})
        assert unknown.status_code == 404
        assert unknown.json()["error"] == "not_found"
        assert admin.get("/v1/jobs/leased").json()["status"] == "running"
        mine = worker.post(
            "/v1/jobs:ack",
            json={"acks": [{"id": "leased", "attempt": 1, "lease": assignment["lease"],
                            "worker_id": "w1"}]},
        )  # fmt: skip
        assert mine.json()["results"] == [
            {"id": "leased", "status": "succeeded", "error": None, "detail": None}
        ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "body.exec"),
        ({"exec": "a.b", "max_attempts": 0}, "body.max_attempts"),
        ({"exec": "a.b", "colour": "red"}, "body.colour"),
        ({"exec": "not a valid exec!"}, "body.exec"),
        ({"exec": "a.b", "id": ""}, "body.id"),
    ],
)
def test_bad_input_is_422_naming_the_field(api_node: RunningNode, body: object, field: str) -> None:
    with api_node.client("client") as client:
        answer = client.post("/v1/jobs", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "invalid"
    assert field in answer.json()["detail"]


def test_a_body_that_is_not_json_is_422_not_500(api_node: RunningNode) -> None:
    with api_node.client("client") as client:
        answer = client.post(
            "/v1/jobs", content=b"{oops", headers={"Content-Type": "application/json"}
        )
    assert answer.status_code == 422
    assert answer.json()["error"] == "invalid"


def test_a_payload_over_the_limit_is_413(api_node: RunningNode) -> None:
    limit = api_node.settings.api.max_payload_bytes
    with api_node.client("client") as client:
        answer = client.post("/v1/jobs", json={"exec": "a.b", "payload": "x" * (limit + 1)})
    assert answer.status_code == 413
    assert answer.json()["error"] == "too_large"

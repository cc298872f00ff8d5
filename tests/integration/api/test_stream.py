"""`WS /v1/stream`: workers that take jobs over a socket, clients that get results pushed."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.integration.api.conftest import RunningNode, poll_until

pytestmark = pytest.mark.integration


def _socket(node: RunningNode, role: str) -> ClientConnection:
    url = node.url.replace("http://", "ws://") + "/v1/stream"
    return connect(
        url, additional_headers={"Authorization": f"Bearer {node.keys[role]}"}, proxy=None
    )


def _receive(socket: ClientConnection, kind: str, timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        message: dict[str, Any] = json.loads(
            socket.recv(timeout=max(0.01, deadline - time.monotonic()))
        )
        if message["type"] == kind:
            return message


def test_a_socket_worker_gets_assignments_pushed_and_a_client_gets_results_pushed(
    api_node: RunningNode,
) -> None:
    with _socket(api_node, "worker") as worker, _socket(api_node, "client") as results:
        results.send(json.dumps({"type": "hello", "role": "client"}))
        _receive(results, "welcome")
        worker.send(
            json.dumps(
                {
                    "type": "hello",
                    "role": "worker",
                    "worker_id": "ws1",
                    "subjects": ["job.assign.>"],
                }
            )
        )
        welcome = _receive(worker, "welcome")
        assert welcome["epoch"] >= 1
        worker.send(json.dumps({"type": "credit", "credits": 2}))
        with api_node.client("client") as client:
            for n in range(2):
                assert (
                    client.post(
                        "/v1/jobs", json={"id": f"s{n}", "exec": "a.b", "payload": n}
                    ).status_code
                    == 202
                )
        assigned = [_receive(worker, "assign") for _ in range(2)]
        assert sorted(a["id"] for a in assigned) == ["s0", "s1"]
        for assignment in assigned:
            lease, result = assignment["lease"], assignment["payload"] * 10
            ack = {
                "type": "ack",
                "id": assignment["id"],
                "attempt": 1,
                "lease": lease,
                "result": result,
            }
            worker.send(json.dumps(ack))
            assert _receive(worker, "settled")["status"] == "succeeded"
        pushed = sorted(
            (r["id"], r["result"]) for r in (_receive(results, "result") for _ in range(2))
        )
        assert pushed == [("s0", 0), ("s1", 10)]


def test_a_closed_socket_loses_the_worker_and_requeues_its_jobs_at_once(
    api_node: RunningNode,
) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as rest_worker:
        with _socket(api_node, "worker") as worker:
            worker.send(
                json.dumps(
                    {
                        "type": "hello",
                        "role": "worker",
                        "worker_id": "ws1",
                        "subjects": ["job.assign.>"],
                    }
                )
            )
            _receive(worker, "welcome")
            worker.send(json.dumps({"type": "credit", "credits": 1}))
            admin.post("/v1/jobs", json={"id": "orphan", "exec": "a.b"})
            assert _receive(worker, "assign")["id"] == "orphan"
        # The socket closed without an ack: the job must come back well before its deadline.
        [again] = poll_until(rest_worker, "rest1", ["job.assign.>"], 1, timeout_s=5)
        assert (again["id"], again["attempt"]) == ("orphan", 2)


def test_a_bad_hello_or_a_wrong_role_closes_the_socket_with_a_reason(api_node: RunningNode) -> None:
    with _socket(api_node, "worker") as socket:
        socket.send(json.dumps({"type": "credit", "credits": 1}))
        assert _receive(socket, "error")["error"] == "invalid"
        with pytest.raises(ConnectionClosed):
            socket.recv(timeout=5)
    with _socket(api_node, "client") as socket:
        socket.send(
            json.dumps(
                {"type": "hello", "role": "worker", "worker_id": "x", "subjects": ["job.assign.>"]}
            )
        )
        assert _receive(socket, "error")["error"] == "forbidden"


def test_an_idle_socket_worker_stays_known_past_the_expiry(api_node: RunningNode) -> None:
    expiry = api_node.settings.dispatcher.worker_expiry_s
    with _socket(api_node, "worker") as worker, api_node.client("admin") as admin:
        hello = {
            "type": "hello",
            "role": "worker",
            "worker_id": "idle",
            "subjects": ["job.assign.>"],
        }
        worker.send(json.dumps(hello))
        _receive(worker, "welcome")
        time.sleep(expiry * 1.7)
        known = [w["worker_id"] for w in admin.get("/v1/workers").json()["workers"]]
        assert "idle" in known
        worker.send(json.dumps({"type": "ping"}))
        assert _receive(worker, "pong") == {"type": "pong"}
        worker.send(json.dumps({"type": "credit", "credits": 1}))
        admin.post("/v1/jobs", json={"id": "late", "exec": "a.b"})
        assert _receive(worker, "assign")["id"] == "late"


def _hello(socket: ClientConnection, worker_id: str, credits: int) -> None:
    hello = {"type": "hello", "role": "worker", "worker_id": worker_id, "subjects": ["job.>"]}
    socket.send(json.dumps(hello))
    _receive(socket, "welcome")
    if credits:
        socket.send(json.dumps({"type": "credit", "credits": credits}))


def test_a_socket_worker_cannot_settle_another_workers_job_with_batched_acks(
    api_node: RunningNode,
) -> None:
    with (
        api_node.client("admin") as admin,
        _socket(api_node, "worker") as holder,
        _socket(api_node, "worker") as other,
    ):
        _hello(holder, "holder", credits=1)
        _hello(other, "other", credits=0)
        admin.post("/v1/jobs", json={"id": "held", "exec": "a.b"})
        assignment = _receive(holder, "assign")
        forged = {"id": "held", "attempt": 1, "lease": assignment["lease"], "result": "x"}
        other.send(json.dumps({"type": "acks", "acks": [forged]}))
        [refused] = _receive(other, "settled_many")["results"]
        assert refused["error"] == "stale_lease"
        assert admin.get("/v1/jobs/held").json()["status"] == "running"
        holder.send(json.dumps({"type": "acks", "acks": [forged]}))
        assert _receive(holder, "settled_many")["results"] == [
            {"id": "held", "status": "succeeded"}
        ]

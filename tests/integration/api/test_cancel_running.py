"""Cancelling a running job and the hard time limit, seen by a worker and a client of a real
node: the worker is told to stop (REST poll and heartbeat answers, WebSocket `cancel`), the
job ends `cancelled` when it confirms or its grace passes, and an attempt never runs past its
`max_run_s`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection

from dispatch.api.memory_log import MemoryLog
from dispatch.core.events import Cancelled, CancelRequested
from dispatch.settings import Settings
from tests.integration.api.conftest import (
    RunningNode,
    poll,
    poll_until,
    receive,
    start_node,
    stop_node,
    stream_socket,
)
from tests.integration.api.processes import ServiceProcess, killable_service, service_client

pytestmark = pytest.mark.integration

GRACE_S = 1.5


def with_short_grace(settings: Settings) -> Settings:
    dispatcher = settings.dispatcher.model_copy(
        update={"cancel_grace_s": GRACE_S, "retry_delay_s": 0.0}
    )
    return settings.model_copy(update={"dispatcher": dispatcher})


@pytest.fixture
def node(api_settings: Settings) -> Iterator[RunningNode]:
    settings = with_short_grace(api_settings)
    running, server, thread = start_node(settings, io=MemoryLog(settings))
    try:
        yield running
    finally:
        stop_node(server, thread)


def held(assignment: dict[str, Any]) -> dict[str, Any]:
    return {"id": assignment["id"], "attempt": assignment["attempt"], "lease": assignment["lease"]}


def settle(worker: httpx.Client, kind: str, assignment: dict[str, Any]) -> httpx.Response:
    body: dict[str, Any] = {"attempt": assignment["attempt"], "lease": assignment["lease"]}
    if kind == "fail":
        body["error"] = "stopped as asked"
    return worker.post(f"/v1/jobs/{assignment['id']}/{kind}", json=body)


def poll_held(
    worker: httpx.Client, worker_id: str, holding: list[dict[str, Any]], epoch: int | None
) -> dict[str, Any]:
    answer = worker.post(
        f"/v1/workers/{worker_id}/poll",
        json={
            "subjects": ["job.assign.>"],
            "credits": 0,
            "wait_s": 0,
            "held": [held(a) for a in holding],
            "epoch": epoch,
        },
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_a_cancelled_running_job_stops_its_rest_worker_and_ends_when_it_confirms(
    node: RunningNode,
) -> None:
    with node.client("client") as client, node.client("worker") as worker:
        assert client.post("/v1/jobs", json={"id": "c1", "exec": "a.b"}).status_code == 202
        [assignment] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        deadline = client.get("/v1/jobs/c1").json()["deadline"]

        answer = client.post("/v1/jobs/c1/cancel", json={"reason": "the user gave up"})
        assert answer.status_code == 200, answer.text
        job = answer.json()
        assert job["status"] == "cancelling" and job["cancel_requested_at"] is not None
        # Asking again answers the same; the job stays cancelling.
        assert client.post("/v1/jobs/c1/cancel").json()["status"] == "cancelling"

        # The worker learns it from its heartbeat's answer, which no longer moves the
        # deadline, and from its poll's (what it holds that must stop).
        beat = worker.post(
            "/v1/jobs/c1/heartbeat",
            json={"attempt": assignment["attempt"], "lease": assignment["lease"]},
        ).json()
        assert beat["cancel"] == "cancel_requested" and beat["deadline"] <= deadline
        polled = poll_held(worker, "w1", [assignment], None)
        assert polled["cancel"] == [{"id": "c1", "attempt": 1, "reason": "cancel_requested"}]

        # It stops and says so (a failure of the attempt): the job ends cancelled.
        assert settle(worker, "fail", assignment).json()["status"] == "cancelled"
        job = client.get("/v1/jobs/c1").json()
        assert job["status"] == "cancelled" and job["error"]
        assert job["cancel_requested_at"] is None and job["deadline"] is None
        # A late ack of that attempt is refused, and the job stays cancelled.
        late = settle(worker, "ack", assignment)
        assert late.status_code == 409, late.text
        assert client.get("/v1/jobs/c1").json()["status"] == "cancelled"
        assert client.delete("/v1/jobs/c1").status_code == 409

    assert node.memory is not None
    events = [event for batch in node.memory.batches() for event in batch.events]
    [requested] = [event for event in events if isinstance(event, CancelRequested)]
    assert requested.by == "dev-client" and requested.reason == "the user gave up"
    [ended] = [event for event in events if isinstance(event, Cancelled)]
    assert ended.worker_id == "w1" and ended.attempt == 1


def test_a_worker_that_never_confirms_loses_the_job_after_the_grace(node: RunningNode) -> None:
    with node.client("client") as client, node.client("worker") as worker:
        # A long ack timeout: the grace, not the attempt's deadline, ends it.
        client.post(
            "/v1/jobs", json={"id": "g1", "exec": "a.b", "timeout_s": 60}
        ).raise_for_status()
        [assignment] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        asked_at = time.time()
        assert client.delete("/v1/jobs/g1").json()["status"] == "cancelling"
        job = client.get("/v1/jobs/g1", params={"wait": 10}).json()
        assert job["status"] == "cancelled", job
        assert time.time() - asked_at >= GRACE_S - 0.2
        # Its slot is the worker's again, and nothing else runs the job.
        assert settle(worker, "ack", assignment).status_code == 409
        assert poll(worker, "w1", ["job.assign.a.b"], credits=1, wait_s=0.3) == []


def _hello(socket: ClientConnection, worker_id: str, holding: list[dict[str, Any]]) -> None:
    socket.send(
        json.dumps(
            {
                "type": "hello",
                "role": "worker",
                "worker_id": worker_id,
                "subjects": ["job.assign.>"],
                "credits": 0 if holding else 1,
                "held": [held(a) for a in holding],
            }
        )
    )
    receive(socket, "welcome")


def test_a_socket_worker_is_told_to_stop_at_once_and_again_when_it_reconnects(
    node: RunningNode,
) -> None:
    with node.client("client") as client:
        with stream_socket(node, "worker") as worker:
            _hello(worker, "ws1", [])
            client.post("/v1/jobs", json={"id": "s1", "exec": "a.b"}).raise_for_status()
            assignment = receive(worker, "assign")
            client.post("/v1/jobs/s1/cancel").raise_for_status()
            order = receive(worker, "cancel")
            assert order == {"type": "cancel", "id": "s1", "attempt": 1,
                             "reason": "cancel_requested"}  # fmt: skip
        # The socket closed before the worker confirmed: the worker is lost, and with it
        # the job ends cancelled (nothing is left to stop it). A new socket that says it
        # still holds the attempt hears at once that it must stop.
        assert client.get("/v1/jobs/s1", params={"wait": 10}).json()["status"] == "cancelled"
        with stream_socket(node, "worker") as worker:
            _hello(worker, "ws1", [assignment])
            order = receive(worker, "cancel")
            assert (order["id"], order["reason"]) == ("s1", "ended")
            fail = {"type": "fail", "id": "s1", "attempt": 1, "lease": assignment["lease"],
                    "error": "cancelled: ended", "retryable": False}  # fmt: skip
            worker.send(json.dumps(fail))
            assert receive(worker, "error")["error"] == "already_settled"


def test_a_socket_worker_that_confirms_ends_the_job_cancelled(node: RunningNode) -> None:
    with node.client("client") as client, stream_socket(node, "worker") as worker:
        _hello(worker, "ws2", [])
        client.post(
            "/v1/jobs", json={"id": "s2", "exec": "a.b", "timeout_s": 60}
        ).raise_for_status()
        assignment = receive(worker, "assign")
        client.post("/v1/jobs/s2/cancel", json={"reason": "not needed"}).raise_for_status()
        assert receive(worker, "cancel")["reason"] == "cancel_requested"
        fail = {"type": "fail", "id": "s2", "attempt": 1, "lease": assignment["lease"],
                "error": "cancelled: cancel_requested", "retryable": False}  # fmt: skip
        worker.send(json.dumps(fail))
        assert receive(worker, "settled")["status"] == "cancelled"
        assert client.get("/v1/jobs/s2").json()["status"] == "cancelled"


def test_an_attempt_stops_at_its_time_limit_whatever_its_heartbeats(node: RunningNode) -> None:
    limit = 1.5
    with node.client("client") as client, node.client("worker") as worker:
        submitted = {"id": "t1", "exec": "a.b", "max_run_s": limit, "max_attempts": 2}
        client.post("/v1/jobs", json=submitted).raise_for_status()
        [first] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        job = client.get("/v1/jobs/t1").json()
        assert job["max_run_s"] == limit and job["run_limit_at"] is not None
        assert job["deadline"] <= job["run_limit_at"]
        # Heartbeats keep the worker's claim, never past the limit.
        refused = None
        for _ in range(40):
            beat = worker.post(
                "/v1/jobs/t1/heartbeat", json={"attempt": 1, "lease": first["lease"]}
            )
            if beat.status_code != 200:
                refused = beat
                break
            assert beat.json()["deadline"] <= job["run_limit_at"]
            time.sleep(0.1)
        assert refused is not None and refused.status_code == 409, "heartbeats carried it on"
        assert time.time() >= job["run_limit_at"] - 0.05
        # The worker's next poll names the attempt to stop.
        polled = poll_held(worker, "w1", [first], None)
        assert {"id": "t1", "attempt": 1} in [
            {"id": o["id"], "attempt": o["attempt"]} for o in polled["cancel"]
        ]
        after = client.get("/v1/jobs/t1").json()
        assert after["status"] in ("retrying", "running") and "time limit" in after["error"]
        # Attempt 2 reaches its limit too: dead, for that reason.
        [second] = poll_until(worker, "w2", ["job.assign.a.b"], 1)
        assert second["attempt"] == 2
        dead = client.get("/v1/jobs/t1", params={"wait": 10}).json()
        assert dead["status"] == "dead" and dead["dead_reason"] == "time_limit", dead


def test_an_admin_cancels_in_bulk_by_exec_pattern_client_and_status(node: RunningNode) -> None:
    with node.client("client") as client, node.client("worker") as worker:
        for n in range(5):
            client.post("/v1/jobs", json={"id": f"b{n}", "exec": "bulk.x"}).raise_for_status()
        client.post("/v1/jobs", json={"id": "keep", "exec": "other.x"}).raise_for_status()
        poll_until(worker, "w1", ["job.assign.bulk.x"], 1)
        forbidden = client.post("/v1/jobs/cancel", json={"exec": "bulk.*"})
        assert forbidden.status_code == 403
    with node.client("admin") as admin:
        answer = admin.post("/v1/jobs/cancel", json={"exec": "bulk.*", "limit": 2})
        assert answer.json() == {"cancelled": 2, "cancelling": 0}, answer.text
        answer = admin.post("/v1/jobs/cancel", json={"exec": "bulk.>", "status": "any"})
        assert answer.json() == {"cancelled": 2, "cancelling": 1}, answer.text
        statuses = {n: admin.get(f"/v1/jobs/b{n}").json()["status"] for n in range(5)}
        assert sorted(statuses.values()) == ["cancelled"] * 4 + ["cancelling"]
        assert admin.get("/v1/jobs/keep").json()["status"] == "queued"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/jobs", {"exec": "a.b", "max_run_s": -1}, "max_run_s"),
        ("/v1/jobs", {"exec": "a.b", "max_run_s": "10"}, "max_run_s"),
        ("/v1/jobs/cancel", {"exec": "a.>.b"}, "exec"),
        ("/v1/jobs/cancel", {"status": "running"}, "exec"),
        ("/v1/jobs/cancel", {"exec": "a.b", "limit": 0}, "limit"),
        ("/v1/jobs/x/cancel", {"reason": "r" * 1001}, "reason"),
    ],
)
def test_bad_input_is_refused_with_422_naming_the_field(
    node: RunningNode, path: str, body: dict[str, Any], field: str
) -> None:
    with node.client("admin") as admin:
        answer = admin.post(path, json=body)
    assert answer.status_code == 422, answer.text
    assert field in answer.text


@pytest.fixture
def service(broker_api_settings: Settings, tmp_path: Path) -> Iterator[ServiceProcess]:
    """A node in a process of its own (so it can be killed -9), on the session's broker."""
    settings = with_short_grace(broker_api_settings)
    dispatcher = settings.dispatcher.model_copy(update={"cancel_grace_s": 60.0})
    settings = settings.model_copy(update={"dispatcher": dispatcher})
    with killable_service(settings, tmp_path / "service.log") as process:
        yield process


def test_a_cancel_a_time_limit_and_progress_survive_a_kill_9(service: ServiceProcess) -> None:
    """The new leader rebuilds both from the log: the worker still hears it must stop the
    cancelled job, and the time-limited job keeps its limit and its last progress report."""
    service.start()

    def client(role: str) -> httpx.Client:
        return service_client(service, role)

    with client("client") as submitter, client("worker") as worker:
        submitter.post("/v1/jobs", json={"id": "k1", "exec": "a.b"}).raise_for_status()
        limited = {"id": "k2", "exec": "a.b", "max_run_s": 600}
        submitter.post("/v1/jobs", json=limited).raise_for_status()
        assignments = poll_until(worker, "w1", ["job.assign.a.b"], 2)
        assert submitter.delete("/v1/jobs/k1").json()["status"] == "cancelling"
        before = submitter.get("/v1/jobs/k2").json()
        [k2] = [a for a in assignments if a["id"] == "k2"]
        report = {"done": 3, "total": 10, "message": "a third"}
        beat = {"attempt": k2["attempt"], "lease": k2["lease"], "progress": report}
        assert worker.post("/v1/jobs/k2/heartbeat", json=beat).status_code == 200
        epoch = poll_held(worker, "w1", assignments, None)["epoch"]

    service.kill()
    started = time.monotonic()
    service.start()

    with client("client") as submitter, client("worker") as worker:
        polled = poll_held(worker, "w1", assignments, epoch)
        assert polled["epoch"] != epoch
        assert polled["cancel"] == [{"id": "k1", "attempt": 1, "reason": "cancel_requested"}]
        after = submitter.get("/v1/jobs/k2").json()
        assert after["status"] == "running"
        assert after["run_limit_at"] == before["run_limit_at"]
        # The last progress report kept is rebuilt from the log too.
        progress = after["progress"]
        assert (progress["done"], progress["total"], progress["message"]) == (3, 10, "a third")
        [k1] = [a for a in assignments if a["id"] == "k1"]
        assert settle(worker, "fail", k1).json()["status"] == "cancelled"
        assert settle(worker, "ack", k2).json()["status"] == "succeeded"
        # The time to the next completed job after the fault.
        print(f"work moving again {time.monotonic() - started:.1f} s after the restart")

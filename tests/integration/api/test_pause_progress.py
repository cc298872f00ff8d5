"""Pausing an exec pattern or a client, and a worker's progress reports, seen through a real
node: a paused queue starts nothing until resumed, a paused client's jobs wait in every exec,
running jobs go on; a report reaches `GET /v1/jobs/{id}` and the client's result stream, at
most one a second."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatch.core.events import Paused, Resumed
from dispatch.settings import Settings
from tests.integration.api.conftest import (
    RunningNode,
    poll,
    poll_until,
    receive,
    stream_socket,
)
from tests.integration.api.processes import ServiceProcess, killable_service, service_client

pytestmark = pytest.mark.integration

ALL = ["job.assign.>"]


def _ack(worker: httpx.Client, assignment: dict[str, Any]) -> str:
    answer = worker.post(
        f"/v1/jobs/{assignment['id']}/ack",
        json={"attempt": assignment["attempt"], "lease": assignment["lease"]},
    )
    assert answer.status_code == 200, answer.text
    status: str = answer.json()["status"]
    return status


def test_a_paused_exec_pattern_starts_nothing_until_it_is_resumed(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        paused = admin.put("/v1/pauses/exec/mail.*", json={"reason": "the SMTP relay is down"})
        assert paused.status_code == 200, paused.text
        [pause] = paused.json()["pauses"]
        assert (pause["scope"], pause["target"], pause["by"]) == ("exec", "mail.*", "dev-admin")
        assert pause["reason"] == "the SMTP relay is down"
        # Pausing again keeps the first pause.
        assert admin.put("/v1/pauses/exec/mail.*").json()["pauses"] == [pause]

        for job_id, exec_name in (("m1", "mail.send"), ("i1", "image.resize")):
            admin.post("/v1/jobs", json={"id": job_id, "exec": exec_name}).raise_for_status()
        [started] = poll_until(worker, "w1", ALL, 1)
        assert started["id"] == "i1", "only what is not paused starts"
        assert poll(worker, "w1", ALL, credits=2, wait_s=0.5) == []
        queues = {q["exec"]: q for q in admin.get("/v1/queues").json()["queues"]}
        assert queues["mail.send"]["paused"] and not queues["image.resize"]["paused"]
        assert admin.get("/v1/jobs/m1").json()["status"] == "queued"

        resumed = admin.delete("/v1/pauses/exec/mail.*")
        assert resumed.status_code == 200 and resumed.json()["pauses"] == []
        [later] = poll_until(worker, "w1", ALL, 1)
        assert later["id"] == "m1"

    assert api_node.memory is not None
    events = [event for batch in api_node.memory.batches() for event in batch.events]
    [paused_event] = [event for event in events if isinstance(event, Paused)]
    [resumed_event] = [event for event in events if isinstance(event, Resumed)]
    assert paused_event.by == resumed_event.by == "dev-admin"


def test_a_paused_client_waits_in_every_exec_while_its_running_jobs_finish(
    api_node: RunningNode,
) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        admin.post("/v1/jobs", json={"id": "a1", "exec": "x.one", "client_id": "acme"})
        [running] = poll_until(worker, "w1", ALL, 1)
        admin.put("/v1/pauses/client/acme").raise_for_status()
        for n, exec_name in enumerate(("x.one", "x.two")):
            body = {"id": f"a{n + 2}", "exec": exec_name, "client_id": "acme"}
            admin.post("/v1/jobs", json=body).raise_for_status()
        admin.post("/v1/jobs", json={"id": "g1", "exec": "x.two", "client_id": "globex"})
        [other] = poll_until(worker, "w1", ALL, 1)
        assert other["id"] == "g1"
        # The running job of the paused client settles as usual.
        assert _ack(worker, running) == "succeeded"
        assert poll(worker, "w1", ALL, credits=3, wait_s=0.5) == []
        admin.delete("/v1/pauses/client/acme").raise_for_status()
        assert sorted(str(a["id"]) for a in poll_until(worker, "w1", ALL, 2)) == ["a2", "a3"]


@pytest.mark.parametrize(
    ("method", "path", "field"),
    [
        ("PUT", "/v1/pauses/queue/x", "scope"),
        ("PUT", "/v1/pauses/exec/a.>.b", "exec"),
        ("DELETE", "/v1/pauses/exec/a..b", "exec"),
        ("PUT", "/v1/pauses/client/" + "c" * 200, "client_id"),
    ],
)
def test_a_bad_pause_is_refused_with_422_naming_the_field(
    api_node: RunningNode, method: str, path: str, field: str
) -> None:
    with api_node.client("admin") as admin:
        answer = admin.request(method, path)
    assert answer.status_code == 422, answer.text
    assert field in answer.text


def test_only_an_admin_pauses(api_node: RunningNode) -> None:
    with api_node.client("client") as client:
        assert client.put("/v1/pauses/exec/a.b").status_code == 403
        assert client.get("/v1/pauses").status_code == 403


def _beat(worker: httpx.Client, assignment: dict[str, Any], **progress: Any) -> httpx.Response:
    return worker.post(
        f"/v1/jobs/{assignment['id']}/heartbeat",
        json={"attempt": assignment["attempt"], "lease": assignment["lease"], "progress": progress},
    )


def test_progress_reaches_the_job_and_its_client_stream_at_most_once_a_second(
    api_node: RunningNode,
) -> None:
    with (
        api_node.client("client") as client,
        api_node.client("worker") as worker,
        stream_socket(api_node, "client") as results,
    ):
        results.send(json.dumps({"type": "hello", "role": "client"}))
        receive(results, "welcome")
        body = {"id": "p1", "exec": "a.b", "timeout_s": 60}
        client.post("/v1/jobs", json=body).raise_for_status()
        [assignment] = poll_until(worker, "w1", ALL, 1)
        assert _beat(worker, assignment, done=1, total=4, message="first").status_code == 200
        job = client.get("/v1/jobs/p1").json()
        assert job["progress"]["done"] == 1 and job["progress"]["message"] == "first"
        pushed = receive(results, "progress")
        assert pushed["id"] == "p1" and pushed["progress"]["total"] == 4
        # Too soon: the heartbeat counts, the report is not kept.
        assert _beat(worker, assignment, done=2, total=4).status_code == 200
        assert client.get("/v1/jobs/p1").json()["progress"]["done"] == 1
        time.sleep(1.05)
        assert _beat(worker, assignment, done=3, total=4).status_code == 200
        assert client.get("/v1/jobs/p1").json()["progress"]["done"] == 3
        assert receive(results, "progress")["progress"]["done"] == 3
        # Refused with the field named.
        bad = _beat(worker, assignment, done=-1)
        assert bad.status_code == 422 and "done" in bad.text
        assert _ack(worker, assignment) == "succeeded"
        final = client.get("/v1/jobs/p1").json()
        assert final["status"] == "succeeded" and final["progress"]["done"] == 3


def test_a_socket_worker_reports_progress_with_its_heartbeat(api_node: RunningNode) -> None:
    with api_node.client("client") as client, stream_socket(api_node, "worker") as worker:
        hello = {"type": "hello", "role": "worker", "worker_id": "ws1", "subjects": ALL}
        worker.send(json.dumps({**hello, "credits": 1}))
        receive(worker, "welcome")
        client.post("/v1/jobs", json={"id": "p2", "exec": "a.b"}).raise_for_status()
        assignment = receive(worker, "assign")
        beat = {"type": "heartbeat", "id": "p2", "attempt": 1, "lease": assignment["lease"]}
        worker.send(json.dumps({**beat, "progress": {"done": 5, "message": "half"}}))
        assert receive(worker, "settled")["of"] == "heartbeat"
        assert client.get("/v1/jobs/p2").json()["progress"]["done"] == 5
        worker.send(json.dumps({**beat, "progress": {"done": "five"}}))
        refused = receive(worker, "error")
        assert refused["error"] == "invalid" and "progress.done" in refused["detail"]


@pytest.fixture
def service(broker_api_settings: Settings, tmp_path: Path) -> Iterator[ServiceProcess]:
    with killable_service(broker_api_settings, tmp_path / "service.log") as process:
        yield process


def test_a_pause_survives_a_kill_9(service: ServiceProcess) -> None:
    """The new leader rebuilds the pauses in force from the log: the paused queue still
    starts nothing, and its resume still works."""
    service.start()
    with service_client(service, "admin") as admin, service_client(service, "worker") as worker:
        admin.put("/v1/pauses/exec/held.>", json={"reason": "maintenance"}).raise_for_status()
        admin.post("/v1/jobs", json={"id": "h1", "exec": "held.job"}).raise_for_status()
        assert poll(worker, "w1", ALL, credits=1, wait_s=0.5) == []

    service.kill()
    started = time.monotonic()
    service.start()

    with service_client(service, "admin") as admin, service_client(service, "worker") as worker:
        [pause] = admin.get("/v1/pauses").json()["pauses"]
        assert (pause["target"], pause["reason"]) == ("held.>", "maintenance")
        assert poll(worker, "w2", ALL, credits=1, wait_s=0.5) == []
        admin.delete("/v1/pauses/exec/held.>").raise_for_status()
        [assignment] = poll_until(worker, "w2", ALL, 1)
        assert assignment["id"] == "h1" and _ack(worker, assignment) == "succeeded"
        print(f"work moving again {time.monotonic() - started:.1f} s after the restart")

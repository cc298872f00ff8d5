"""`WS /v1/stream`: workers that take jobs over a socket, clients that get results pushed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from dispatch.api.memory_log import MemoryLog
from tests.integration.api.conftest import (
    RunningNode,
    poll_until,
    receive,
    start_node,
    stream_socket,
)

pytestmark = pytest.mark.integration


def test_a_socket_worker_gets_assignments_pushed_and_a_client_gets_results_pushed(
    api_node: RunningNode,
) -> None:
    with stream_socket(api_node, "worker") as worker, stream_socket(api_node, "client") as results:
        results.send(json.dumps({"type": "hello", "role": "client"}))
        receive(results, "welcome")
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
        welcome = receive(worker, "welcome")
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
        assigned = [receive(worker, "assign") for _ in range(2)]
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
            assert receive(worker, "settled")["status"] == "succeeded"
        pushed = sorted(
            (r["id"], r["result"]) for r in (receive(results, "result") for _ in range(2))
        )
        assert pushed == [("s0", 0), ("s1", 10)]


def test_a_closed_socket_loses_the_worker_and_requeues_its_jobs_at_once(
    api_node: RunningNode,
) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as rest_worker:
        with stream_socket(api_node, "worker") as worker:
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
            receive(worker, "welcome")
            worker.send(json.dumps({"type": "credit", "credits": 1}))
            admin.post("/v1/jobs", json={"id": "orphan", "exec": "a.b"})
            assert receive(worker, "assign")["id"] == "orphan"
        # The socket closed without an ack: the job must come back well before its deadline.
        [again] = poll_until(rest_worker, "rest1", ["job.assign.>"], 1, timeout_s=5)
        assert (again["id"], again["attempt"]) == ("orphan", 2)


def test_a_bad_hello_or_a_wrong_role_closes_the_socket_with_a_reason(api_node: RunningNode) -> None:
    with stream_socket(api_node, "worker") as socket:
        socket.send(json.dumps({"type": "credit", "credits": 1}))
        assert receive(socket, "error")["error"] == "invalid"
        with pytest.raises(ConnectionClosed):
            socket.recv(timeout=5)
    with stream_socket(api_node, "client") as socket:
        socket.send(
            json.dumps(
                {"type": "hello", "role": "worker", "worker_id": "x", "subjects": ["job.assign.>"]}
            )
        )
        assert receive(socket, "error")["error"] == "forbidden"


def test_a_frame_nested_too_deep_for_json_is_refused_with_a_reason(api_node: RunningNode) -> None:
    # json.loads recurses per level: ~5,000 levels raised RecursionError, a traceback and 1006.
    with stream_socket(api_node, "worker") as socket:
        socket.send("[" * 5_000 + "]" * 5_000)
        refusal = receive(socket, "error")
        assert refusal["error"] == "invalid" and "nested deeper" in refusal["detail"]
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_an_idle_socket_worker_stays_known_past_the_expiry(api_node: RunningNode) -> None:
    expiry = api_node.settings.dispatcher.worker_expiry_s
    with stream_socket(api_node, "worker") as worker, api_node.client("admin") as admin:
        hello = {
            "type": "hello",
            "role": "worker",
            "worker_id": "idle",
            "subjects": ["job.assign.>"],
        }
        worker.send(json.dumps(hello))
        receive(worker, "welcome")
        time.sleep(expiry * 1.7)
        known = [w["worker_id"] for w in admin.get("/v1/workers").json()["workers"]]
        assert "idle" in known
        worker.send(json.dumps({"type": "ping"}))
        assert receive(worker, "pong") == {"type": "pong"}
        worker.send(json.dumps({"type": "credit", "credits": 1}))
        admin.post("/v1/jobs", json={"id": "late", "exec": "a.b"})
        assert receive(worker, "assign")["id"] == "late"


def _hello(socket: ClientConnection, worker_id: str, credits: int) -> None:
    hello = {"type": "hello", "role": "worker", "worker_id": worker_id, "subjects": ["job.>"]}
    socket.send(json.dumps(hello))
    receive(socket, "welcome")
    if credits:
        socket.send(json.dumps({"type": "credit", "credits": credits}))


def test_a_socket_worker_cannot_settle_another_workers_job_with_batched_acks(
    api_node: RunningNode,
) -> None:
    with (
        api_node.client("admin") as admin,
        stream_socket(api_node, "worker") as holder,
        stream_socket(api_node, "worker") as other,
    ):
        _hello(holder, "holder", credits=1)
        _hello(other, "other", credits=0)
        admin.post("/v1/jobs", json={"id": "held", "exec": "a.b"})
        assignment = receive(holder, "assign")
        forged = {"id": "held", "attempt": 1, "lease": assignment["lease"], "result": "x"}
        other.send(json.dumps({"type": "acks", "acks": [forged]}))
        [refused] = receive(other, "settled_many")["results"]
        assert refused["error"] == "stale_lease"
        assert admin.get("/v1/jobs/held").json()["status"] == "running"
        holder.send(json.dumps({"type": "acks", "acks": [forged]}))
        assert receive(holder, "settled_many")["results"] == [{"id": "held", "status": "succeeded"}]


def test_a_term_that_ends_closes_its_sockets_with_1013_naming_the_leader(
    api_node: RunningNode,
) -> None:
    with stream_socket(api_node, "worker") as worker, stream_socket(api_node, "client") as results:
        _hello(worker, "termed", credits=1)
        results.send(json.dumps({"type": "hello", "role": "client"}))
        receive(results, "welcome")
        leader = api_node.node._leader
        assert leader is not None
        leader.stop()  # the term ends; the node, still holding the lease, starts another
        for socket in (worker, results):
            error = receive(socket, "error")
            assert error["error"] in ("not_leader", "unavailable")
            assert error["leader"] == api_node.url  # this node leads again
            with pytest.raises(ConnectionClosed) as closed:
                socket.recv(timeout=5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013


def _keys_with_another_worker(settings: Any) -> str:
    """Add a second worker key (another owner) to the node's keys file; the plain key."""
    from dispatch.auth import ensure_dev_keys, hash_key

    ensure_dev_keys(settings.auth)
    document = json.loads(settings.auth.keys_file.read_text())
    key = "other-worker-key-0123456789"
    entry = {
        "name": "other-worker",
        "role": "worker",
        "client_id": "other",
        "sha256": hash_key(key),
    }
    document["keys"].append(entry)
    settings.auth.keys_file.write_text(json.dumps(document))
    return key


@pytest.fixture
def two_worker_keys(api_settings: Any) -> Iterator[tuple[RunningNode, str]]:
    other = _keys_with_another_worker(api_settings)
    running, server, thread = start_node(api_settings, io=MemoryLog(api_settings))
    try:
        yield running, other
    finally:
        server.should_exit = True
        thread.join(30)


def test_a_worker_id_belongs_to_its_key(two_worker_keys: tuple[RunningNode, str]) -> None:
    node, other_key = two_worker_keys
    url = node.url.replace("http://", "ws://") + "/v1/stream"
    with node.client("admin") as admin, stream_socket(node, "worker") as real:
        _hello(real, "owned", credits=1)
        other = httpx.Client(
            base_url=node.url, headers={"Authorization": f"Bearer {other_key}"}, timeout=30
        )
        with other:
            # A REST poll with another key: 403; with the real key while the socket is
            # open: 409 (it would replace the socket's credit and subjects).
            stolen = other.post(
                "/v1/workers/owned/poll", json={"subjects": ["job.>"], "credits": 1, "wait_s": 0}
            )
            assert stolen.status_code == 403, stolen.text
            with node.client("worker") as same_key:
                busy = same_key.post(
                    "/v1/workers/owned/poll",
                    json={"subjects": ["x.>"], "credits": 5, "wait_s": 0},
                )
                assert busy.status_code == 409, busy.text
        # An impostor socket with another key: refused, and the real worker stays known.
        headers = {"Authorization": f"Bearer {other_key}"}
        with connect(url, additional_headers=headers, proxy=None) as impostor:
            impostor.send(
                json.dumps(
                    {"type": "hello", "role": "worker", "worker_id": "owned", "subjects": ["x.>"]}
                )
            )
            assert receive(impostor, "error")["error"] == "forbidden"
            with pytest.raises(ConnectionClosed) as closed:
                impostor.recv(timeout=5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        [known] = [
            w for w in admin.get("/v1/workers").json()["workers"] if w["worker_id"] == "owned"
        ]
        assert known["subjects"] == ["job.>"]
        admin.post("/v1/jobs", json={"id": "mine", "exec": "a.b"})
        assignment = receive(real, "assign")
        assert assignment["id"] == "mine"
        # The other key cannot settle it with the lease either.
        with httpx.Client(base_url=node.url, headers=headers, timeout=30) as other:
            forged = other.post(
                "/v1/jobs/mine/ack", json={"attempt": 1, "lease": assignment["lease"]}
            )
            assert forged.status_code == 409, forged.text


def test_results_go_to_client_keys_only(api_node: RunningNode) -> None:
    with stream_socket(api_node, "worker") as socket:
        socket.send(json.dumps({"type": "hello", "role": "client"}))
        assert receive(socket, "error")["error"] == "forbidden"
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    # A key in the query string is not read (it would be written to access logs).
    url = api_node.url.replace("http://", "ws://") + f"/v1/stream?key={api_node.keys['client']}"
    with connect(url, proxy=None) as socket:
        socket.send(json.dumps({"type": "hello", "role": "client"}))
        assert receive(socket, "error")["error"] == "unauthorized"
    # A browser puts it in the hello.
    with connect(url.partition("?")[0], proxy=None) as socket:
        hello = {"type": "hello", "role": "client", "key": api_node.keys["client"]}
        socket.send(json.dumps(hello))
        assert receive(socket, "welcome")["type"] == "welcome"


def test_a_new_socket_of_the_same_worker_requeues_what_it_does_not_hold(
    api_node: RunningNode,
) -> None:
    with api_node.client("admin") as admin, stream_socket(api_node, "worker") as first:
        _hello(first, "again", credits=2)
        admin.post("/v1/jobs", json={"id": "kept", "exec": "a.b"})
        admin.post("/v1/jobs", json={"id": "lost", "exec": "a.b"})
        assigned = {a["id"]: a for a in (receive(first, "assign") for _ in range(2))}
        kept = assigned["kept"]
        with stream_socket(api_node, "worker") as second:
            hello = {
                "type": "hello", "role": "worker", "worker_id": "again", "subjects": ["job.>"],
                "credits": 0,
                "held": [{"id": "kept", "attempt": kept["attempt"], "lease": kept["lease"]}],
            }  # fmt: skip
            second.send(json.dumps(hello))
            receive(second, "welcome")
            # The first socket is replaced (closed without losing the worker).
            assert receive(first, "error")["error"] == "replaced"
            lost = admin.get("/v1/jobs/lost").json()
            # Queued again after its attempt (shown as retrying), at once: no retry delay.
            assert (lost["status"], lost["attempts"]) == ("retrying", 1)
            assert lost["next_attempt_at"] is None
            [worker] = [
                w for w in admin.get("/v1/workers").json()["workers"] if w["worker_id"] == "again"
            ]
            assert (worker["running"], worker["credit"]) == (["kept"], 0)
            ack = {"type": "ack", "id": "kept", "attempt": 1, "lease": kept["lease"]}
            second.send(json.dumps(ack))
            assert receive(second, "settled")["status"] == "succeeded"


def test_a_worker_that_reads_batches_gets_what_was_committed_together_in_one_message(
    api_node: RunningNode,
) -> None:
    ids = [f"batched-{n}" for n in range(3)]
    with stream_socket(api_node, "worker") as worker:
        hello = {"type": "hello", "role": "worker", "worker_id": "ws-batch",
                 "subjects": ["job.assign.batched.>"], "batch": True}  # fmt: skip
        worker.send(json.dumps(hello))
        receive(worker, "welcome")
        with api_node.client("client") as client:
            for job_id in ids:
                body = {"id": job_id, "exec": "batched.job", "payload": job_id}
                assert client.post("/v1/jobs", json=body).status_code == 202
        for job_id in ids:
            api_node.wait_known(job_id)
        # Credit for all three at once: the leader assigns them in one iteration.
        worker.send(json.dumps({"type": "credit", "credits": 3}))
        message = receive(worker, "assign_many")
        assignments = message["assignments"]
        assert sorted(a["id"] for a in assignments) == ids
        assert {a["payload"] for a in assignments} == set(ids)
        acks = [{"id": a["id"], "attempt": a["attempt"], "lease": a["lease"], "result": 1}
                for a in assignments]  # fmt: skip
        worker.send(json.dumps({"type": "acks", "acks": acks}))
        results = receive(worker, "settled_many")["results"]
        assert sorted((r["id"], r["status"]) for r in results) == [
            (job_id, "succeeded") for job_id in ids
        ]


def test_a_hello_whose_batch_is_not_a_boolean_is_refused_by_name(api_node: RunningNode) -> None:
    with stream_socket(api_node, "worker") as worker:
        hello = {"type": "hello", "role": "worker", "worker_id": "ws-batch-bad",
                 "subjects": ["job.assign.>"], "batch": "yes"}  # fmt: skip
        worker.send(json.dumps(hello))
        error = receive(worker, "error")
        assert "hello.batch" in error["detail"]

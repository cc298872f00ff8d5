"""Any node serves any client call: two `dispatch serve` processes on the session's broker, and
plain HTTP clients that follow no redirect. Through the follower a client gets the leader's
answer (the same status and body as on the leader), a long-poll returns when the job ends,
and a follower whose leader is down answers 503, never a 202 for a job that will not exist."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kafka import KafkaConsumer

from dispatch.auth import ensure_dev_keys, hash_key
from dispatch.settings import Settings
from dispatch.stack.ports import free_port
from tests.integration.api.conftest import poll_until
from tests.integration.api.processes import ServiceProcess, start_a_pair

pytestmark = pytest.mark.integration

TENANT_B = "tenant-b"


class Pair:
    """A leader and its follower, and keys: the dev keys (tenant A is the dev client) and a
    client key of a second tenant."""

    def __init__(self, settings: Settings, folder: Path) -> None:
        self.settings = settings
        self.keys = ensure_dev_keys(settings.auth)
        self.keys[TENANT_B] = _add_client_key(settings, TENANT_B)
        self.leader = ServiceProcess(settings, free_port(), folder / "one.log")
        self.follower = ServiceProcess(settings, free_port(), folder / "other.log")

    def start(self) -> None:
        self.leader, self.follower = start_a_pair(self.leader, self.follower)
        deadline = time.monotonic() + 30
        while self.follower.readiness()["leader"] != self.leader.url:
            assert time.monotonic() < deadline, "the follower never saw the leader"
            time.sleep(0.1)

    def stop(self) -> None:
        self.leader.stop()
        self.follower.stop()

    def client(self, url: str, key: str = "client", timeout: float = 10) -> httpx.Client:
        """A plain HTTP client: one node, no redirects followed."""
        return httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {self.keys[key]}"},
            timeout=timeout,
            follow_redirects=False,
        )


def _add_client_key(settings: Settings, client_id: str) -> str:
    """A client key of its own tenant, added to the keys file before the nodes load it."""
    key = f"test_{secrets.token_urlsafe(24)}"
    keys_file = settings.auth.keys_file
    document = json.loads(keys_file.read_text())
    document["keys"].append(
        {"name": client_id, "role": "client", "client_id": client_id, "sha256": hash_key(key)}
    )
    keys_file.write_text(json.dumps(document))
    return key


@pytest.fixture
def pair(broker_api_settings: Settings, tmp_path: Path) -> Iterator[Pair]:
    # A long lease: a leader killed keeps it for a while, so its follower stays a follower
    # (instead of leading after `ttl_s`) for as long as a test needs.
    lease = broker_api_settings.lease.model_copy(update={"ttl_s": 20.0})
    nodes = Pair(broker_api_settings.model_copy(update={"lease": lease}), tmp_path)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()  # both processes, by the pids this test started


def _submitted_keys(settings: Settings) -> set[bytes]:
    """Every key (job id) in the submit topic, read to its end."""
    consumer = KafkaConsumer(
        settings.kafka.submit_topic,
        bootstrap_servers=settings.kafka.bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=3_000,
    )
    try:
        return {record.key for record in consumer}
    finally:
        consumer.close()


def _answer(response: httpx.Response) -> tuple[int, object]:
    return response.status_code, response.json()


def test_a_plain_client_reads_and_waits_through_the_follower(pair: Pair) -> None:
    with (
        pair.client(pair.follower.url) as follower,
        pair.client(pair.leader.url, "worker") as worker,
    ):
        accepted = follower.post("/v1/jobs", json={"id": "j1", "exec": "fw.echo", "payload": 1})
        assert accepted.status_code == 202, accepted.text
        # 202 is Kafka's acknowledgement; the leader knows the job once it consumed it.
        deadline = time.monotonic() + 20
        while (read := follower.get("/v1/jobs/j1")).status_code == 404:
            assert time.monotonic() < deadline, "the job never became readable"
            time.sleep(0.1)
        assert read.status_code == 200, read.text
        assert read.json()["id"] == "j1" and read.json()["status"] == "queued"

        # A long-poll through the follower returns when the job finishes on the leader.
        waited: list[httpx.Response] = []
        with pair.client(pair.follower.url, timeout=60) as long_poll:
            waiting = threading.Thread(
                target=lambda: waited.append(long_poll.get("/v1/jobs/j1", params={"wait": 30}))
            )
            waiting.start()
            time.sleep(1.0)  # the wait is under way on the leader
            assert waited == [], "the long-poll answered before the job finished"
            [assignment] = poll_until(worker, "fw-1", ["job.assign.fw.>"], 1)
            started = time.monotonic()
            acked = worker.post(
                "/v1/jobs/j1/ack",
                json={"attempt": assignment["attempt"], "lease": assignment["lease"], "result": 7},
            )
            assert acked.status_code == 200, acked.text
            waiting.join(20)
            assert not waiting.is_alive(), "the long-poll did not return when the job finished"
            assert time.monotonic() - started < 10
        [done] = waited
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "succeeded" and done.json()["result"] == 7

    with (
        pair.client(pair.follower.url, "admin") as follower,
        pair.client(pair.leader.url, "admin") as leader,
    ):
        # Admin reads and commands: the leader's answers, whichever node was asked.
        for path in ("/v1/queues", "/v1/leader", "/v1/dlq", "/v1/jobs/nothing-here"):
            assert _answer(follower.get(path)) == _answer(leader.get(path)), path
        assert follower.get("/v1/leader").json()["node"] == pair.leader.url
        cancelled = follower.delete("/v1/jobs/j1")
        assert cancelled.status_code == 409, cancelled.text  # succeeded: not cancellable
        # The worker routes keep their 307 to the leader.
        redirected = follower.post(
            "/v1/workers/w-x/poll", json={"subjects": ["job.assign.>"], "credits": 0}
        )
        assert redirected.status_code == 307
        assert redirected.headers["location"] == f"{pair.leader.url}/v1/workers/w-x/poll"
    metrics = httpx.get(f"{pair.follower.url}/metrics", timeout=5).text
    assert 'dispatch_forwarded_total{outcome="relayed"}' in metrics


def test_a_submission_through_the_follower_gets_the_leaders_answer(pair: Pair) -> None:
    with (
        pair.client(pair.leader.url) as a_on_leader,
        pair.client(pair.follower.url) as a_on_follower,
        pair.client(pair.leader.url, TENANT_B) as b_on_leader,
        pair.client(pair.follower.url, TENANT_B) as b_on_follower,
    ):
        first = a_on_leader.post("/v1/jobs", json={"id": "X", "exec": "fw.echo", "payload": 1})
        assert first.status_code == 202, first.text
        deadline = time.monotonic() + 20
        while a_on_leader.get("/v1/jobs/X").status_code != 200:
            assert time.monotonic() < deadline, "the leader never consumed X"
            time.sleep(0.1)

        # Tenant B takes A's id: the follower answers what the leader answers (an id taken),
        # not a 202 for a job that would never exist.
        through_follower = b_on_follower.post("/v1/jobs", json={"id": "X", "exec": "fw.echo"})
        on_leader = b_on_leader.post("/v1/jobs", json={"id": "X", "exec": "fw.echo"})
        assert _answer(through_follower) == _answer(on_leader)
        assert through_follower.status_code == 409, through_follower.text
        assert through_follower.json()["error"] == "conflict"
        batch = {"jobs": [{"id": "X", "exec": "fw.echo"}, {"id": "b-own", "exec": "fw.echo"}]}
        assert _answer(b_on_follower.post("/v1/jobs:batch", json=batch)) == _answer(
            b_on_leader.post("/v1/jobs:batch", json=batch)
        )
        assert b_on_follower.get("/v1/jobs/b-own").status_code == 404  # all or nothing

        # A again with another payload, through the follower: the existing job, as the
        # leader answers it.
        again = a_on_follower.post("/v1/jobs", json={"id": "X", "exec": "fw.echo", "payload": 2})
        assert again.status_code == 200, again.text
        assert again.json()["existing"] is True and again.json()["status"] == "queued"
        assert _answer(again) == _answer(
            a_on_leader.post("/v1/jobs", json={"id": "X", "exec": "fw.echo", "payload": 3})
        )
        assert a_on_follower.get("/v1/jobs/X").json()["payload"] == 1

        # Refusals keep their words; an encoded id reaches the leader as it was sent.
        invalid = b_on_follower.post("/v1/jobs", json={"id": "y"})
        assert _answer(invalid) == _answer(b_on_leader.post("/v1/jobs", json={"id": "y"}))
        assert invalid.status_code == 422
        odd = "/v1/jobs/caf%C3%A9-%E2%9C%93%0D%0A"
        assert _answer(b_on_follower.get(odd)) == _answer(b_on_leader.get(odd))
        assert "café-✓" in b_on_follower.get(odd).json()["detail"]
        unknown_key = httpx.get(
            f"{pair.follower.url}/v1/jobs/X", headers={"Authorization": "Bearer nope"}
        )
        assert unknown_key.status_code == 401


def test_a_follower_whose_leader_is_down_answers_503(pair: Pair) -> None:
    pair.leader.kill()  # kill -9: its lease stays live for ttl_s, the follower still follows
    with pair.client(pair.follower.url) as follower:
        refused = follower.post("/v1/jobs", json={"id": "while-down", "exec": "fw.echo"})
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"] == "unavailable"
        batch = follower.post("/v1/jobs:batch", json={"jobs": [{"id": "b1", "exec": "fw.echo"}]})
        assert batch.status_code == 503, batch.text
        read = follower.get("/v1/jobs/while-down")
        assert read.status_code == 503 and "retry-after" in read.headers
        assert follower.get("/v1/queues").status_code == 503
    assert pair.follower.readiness()["role"] == "follower", "the lease expired during the test"
    # Nothing was written behind the client's back.
    assert {b"while-down", b"b1"}.isdisjoint(_submitted_keys(pair.settings))
    metrics = httpx.get(f"{pair.follower.url}/metrics", timeout=5).text
    assert 'dispatch_forwarded_total{outcome="unreachable"} 4.0' in metrics


def test_the_sdk_moves_to_the_leader_a_follower_names(pair: Pair) -> None:
    """The SDK reaches the follower first (the only node it was given): the relayed answer
    names the leader, on the same host, and the next call goes there without the hop."""
    from dispatch.client import Client

    with Client(pair.follower.url, pair.keys["client"]) as client:
        accepted = client.submit("fw.hint", 1, id="hint-1")
        assert accepted.id == "hint-1"
        assert client.router.current == pair.leader.url
        assert client.submit("fw.hint", 2, id="hint-2").id == "hint-2"
        assert client.router.current == pair.leader.url

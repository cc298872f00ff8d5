"""Clients over REST against a real node and a real Kafka broker."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from kafka import KafkaProducer

from tests.integration.api.conftest import RunningNode, poll, poll_until


def ack(worker: httpx.Client, assignment: dict[str, object], result: object = None) -> None:
    answer = worker.post(
        f"/v1/jobs/{assignment['id']}/ack",
        json={"attempt": assignment["attempt"], "lease": assignment["lease"], "result": result},
    )
    assert answer.status_code == 200, answer.text


pytestmark = pytest.mark.integration


def test_a_job_flows_from_submit_to_worker_and_back(api_node: RunningNode) -> None:
    with api_node.client("client") as client, api_node.client("worker") as worker:
        accepted = client.post(
            "/v1/jobs", json={"exec": "image.resize", "payload": {"w": 10}, "id": "job-1"}
        )
        assert accepted.status_code == 202, accepted.text
        assert accepted.json() == {
            "id": "job-1", "status": "queued", "existing": False,
            "warning": "no worker serves exec 'image.resize' now: the job waits until one does",
        }  # fmt: skip

        polled = worker.post(
            "/v1/workers/w1/poll",
            json={"subjects": ["job.assign.image.*"], "credits": 1, "wait_s": 10},
        )
        assert polled.status_code == 200, polled.text
        [assignment] = polled.json()["assignments"]
        assert assignment["id"] == "job-1"
        assert assignment["payload"] == {"w": 10}
        assert assignment["attempt"] == 1

        acked = worker.post(
            "/v1/jobs/job-1/ack",
            json={"attempt": 1, "lease": assignment["lease"], "result": {"ok": True}},
        )
        assert acked.status_code == 200, acked.text
        assert acked.json()["status"] == "succeeded"

        job = client.get("/v1/jobs/job-1", params={"wait": 5}).json()
        assert job["status"] == "succeeded"
        assert job["result"] == {"ok": True}
        assert job["attempts"] == 1
        assert "lease" not in job


def test_a_raw_kafka_producer_submission_runs_like_a_rest_one(broker_api_node: RunningNode) -> None:
    kafka = broker_api_node.settings.kafka
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    producer.send(
        kafka.submit_topic,
        key=b"raw-1",
        value=json.dumps({"id": "raw-1", "exec": "report.build", "payload": [1, 2]}).encode(),
    ).get(timeout=30)
    producer.close()
    with broker_api_node.client("admin") as admin, broker_api_node.client("worker") as worker:
        [assignment] = poll_until(worker, "w1", ["job.assign.report.>"], 1)
        assert (assignment["id"], assignment["payload"]) == ("raw-1", [1, 2])
        ack(worker, assignment, result="done")
        job = admin.get("/v1/jobs/raw-1", params={"wait": 10}).json()
        assert (job["status"], job["client_id"], job["result"]) == ("succeeded", "kafka", "done")


def test_malformed_records_land_in_the_rejected_topic_and_the_rest_go_on(
    broker_api_node: RunningNode,
) -> None:
    kafka = broker_api_node.settings.kafka
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    bad = [b"{not json", json.dumps({"id": "x", "payload": 1}).encode()]
    for value in bad:
        producer.send(kafka.submit_topic, key=b"x", value=value)
    good = json.dumps({"id": "good-1", "exec": "a.b", "payload": None}).encode()
    producer.send(kafka.submit_topic, key=b"good-1", value=good).get(timeout=30)
    producer.close()

    rejections = broker_api_node.rejections(len(bad))
    assert sorted(rejection.value for rejection in rejections if rejection.value) == sorted(bad)
    reasons = " | ".join(rejection.reason for rejection in rejections)
    assert "not JSON" in reasons
    assert "exec" in reasons
    with broker_api_node.client("admin") as admin:
        assert admin.get("/v1/jobs/good-1", params={"wait": 0}).status_code in (200, 404)
    broker_api_node.wait_known("good-1")  # the good record after the bad ones


def test_a_duplicate_submission_yields_one_job(api_node: RunningNode) -> None:
    with api_node.client("client") as client, api_node.client("worker") as worker:
        first = client.post("/v1/jobs", json={"id": "dup", "exec": "a.b", "payload": 1})
        assert first.status_code == 202
        [assignment] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        again = client.post("/v1/jobs", json={"id": "dup", "exec": "a.b", "payload": 2})
        assert again.status_code == 200
        assert again.json() == {"id": "dup", "status": "running", "existing": True}
        ack(worker, assignment)
        assert poll(worker, "w1", ["job.assign.a.b"], wait_s=1.0) == []
        job = client.get("/v1/jobs/dup").json()
        assert (job["status"], job["payload"], job["attempts"]) == ("succeeded", 1, 1)


def test_a_batch_is_validated_whole_and_accepted_whole(api_node: RunningNode) -> None:
    with api_node.client("client") as client:
        refused = client.post("/v1/jobs:batch", json={"jobs": [{"exec": "a.b"}, {"exec": "a..b"}]})
        assert refused.status_code == 422
        assert "body.jobs[1].exec" in refused.json()["detail"]
        accepted = client.post(
            "/v1/jobs:batch", json={"jobs": [{"exec": "a.b", "id": f"b{n}"} for n in range(50)]}
        )
        assert accepted.status_code == 202
        assert [job["id"] for job in accepted.json()["jobs"]] == [f"b{n}" for n in range(50)]
    with api_node.client("admin") as admin:
        deadline = time.monotonic() + 20
        while sum(q["ready"] for q in admin.get("/v1/queues").json()["queues"]) < 50:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_result_is_awaited_with_long_poll(api_node: RunningNode) -> None:
    with api_node.client("client") as client, api_node.client("worker") as worker:
        client.post("/v1/jobs", json={"id": "slow", "exec": "a.b"})
        [assignment] = poll_until(worker, "w1", ["job.assign.>"], 1)
        timer = threading.Timer(0.4, lambda: ack(worker, assignment, result=42))
        timer.start()
        started = time.monotonic()
        job = client.get("/v1/jobs/slow", params={"wait": 20}).json()
        timer.join()
        assert job["status"] == "succeeded" and job["result"] == 42
        assert 0.3 < time.monotonic() - started < 10


def test_cancel_a_queued_job_at_once_a_running_one_through_its_worker_a_finished_one_never(
    api_node: RunningNode,
) -> None:
    with api_node.client("client") as client, api_node.client("worker") as worker:
        client.post("/v1/jobs", json={"id": "c1", "exec": "a.b", "timeout_s": 60})
        client.post("/v1/jobs", json={"id": "c2", "exec": "a.b", "timeout_s": 60})
        [assignment] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        running, queued = (assignment["id"], "c2" if assignment["id"] == "c1" else "c1")
        cancelling = client.delete(f"/v1/jobs/{running}")
        assert cancelling.status_code == 200, cancelling.text
        assert cancelling.json()["status"] == "cancelling"
        cancelled = client.delete(f"/v1/jobs/{queued}")
        assert cancelled.status_code == 200
        assert cancelled.json()["status"] == "cancelled"
        later = poll(worker, "w1", ["job.assign.a.b"], credits=5, wait_s=1.0)
        assert queued not in [assignment["id"] for assignment in later]
        acked = worker.post(
            f"/v1/jobs/{running}/ack", json={"attempt": 1, "lease": assignment["lease"]}
        )
        # It acked before it heard of the cancel: the work was done, the job succeeded.
        assert acked.json()["status"] == "succeeded"
        refused = client.delete(f"/v1/jobs/{running}")
        assert refused.status_code == 409
        assert refused.json()["error"] == "not_cancellable"


def test_a_permanent_failure_dead_letters_and_redrive_runs_it_again(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        admin.post("/v1/jobs", json={"id": "d1", "exec": "a.b", "max_attempts": 5})
        [assignment] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        failed = worker.post(
            "/v1/jobs/d1/fail",
            json={
                "attempt": 1,
                "lease": assignment["lease"],
                "error": "bad input",
                "retryable": False,
            },
        )
        assert failed.json()["status"] == "dead"
        [dead] = admin.get("/v1/dlq").json()["jobs"]
        assert (dead["id"], dead["dead_reason"], dead["error"]) == (
            "d1",
            "permanent_failure",
            "bad input",
        )

        redriven = admin.post("/v1/dlq/d1/redrive")
        assert redriven.status_code == 200
        assert (redriven.json()["status"], redriven.json()["attempts"]) == ("queued", 0)
        assert admin.post("/v1/dlq/d1/redrive").status_code == 409
        [again] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        assert again["attempt"] == 1
        ack(worker, again)
        assert admin.get("/v1/dlq").json()["jobs"] == []


def _nested(depth: int) -> object:
    value: object = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_a_too_deep_payload_is_refused_with_422_naming_the_field(api_node: RunningNode) -> None:
    with api_node.client("client") as client:
        one = client.post("/v1/jobs", json={"id": "deep", "exec": "a.b", "payload": _nested(300)})
        assert one.status_code == 422, one.text
        assert one.json()["detail"] == "body.payload: nested deeper than 32 levels"
        batch = client.post(
            "/v1/jobs:batch",
            json={"jobs": [{"exec": "a.b"}, {"exec": "a.b", "payload": {"x": _nested(33)}}]},
        )
        assert batch.status_code == 422, batch.text
        assert batch.json()["detail"].startswith("body.jobs[1].payload: nested deeper")
        assert client.get("/v1/jobs/deep").status_code == 404


def test_the_deepest_payload_allowed_round_trips_through_reads_and_the_poll(
    api_node: RunningNode,
) -> None:
    payload = {"deep": _nested(31)}  # 32 levels with the object around it: the limit
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        accepted = admin.post("/v1/jobs", json={"id": "deep-ok", "exec": "a.b", "payload": payload})
        assert accepted.status_code == 202, accepted.text
        [assignment] = poll_until(worker, "w1", ["job.assign.a.b"], 1)
        assert assignment["payload"] == payload
        failed = worker.post(
            "/v1/jobs/deep-ok/fail",
            json={"attempt": 1, "lease": assignment["lease"], "error": "no", "retryable": False},
        )
        assert failed.status_code == 200, failed.text
        job = admin.get("/v1/jobs/deep-ok")
        assert job.status_code == 200 and job.json()["payload"] == payload
        [dead] = admin.get("/v1/dlq").json()["jobs"]
        assert (dead["id"], dead["payload"]) == ("deep-ok", payload)


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"exec":"a.b","payload":{"x":NaN}}', "body.payload.x: NaN is not JSON"),
        (b'{"exec":"a.b","payload":[1,Infinity]}', "body.payload[1]: Infinity is not JSON"),
        (b'{"exec":"a.b","timeout_s":NaN}', "body.timeout_s: expected a finite number, got nan"),
        (b'{"exec":"a.b","max_attempts":2147483648}', "body.max_attempts: expected an integer"),
        (b'{"exec":"a.b","id":"a/b"}', "body.id: expected 1 to 128 of A-Z a-z 0-9"),
        (b'{"exec":"a.b","id":"..%2f"}', "body.id: expected 1 to 128 of A-Z a-z 0-9"),
        (b'{"exec":"a.b","id":"x..y"}', "body.id: expected 1 to 128 of A-Z a-z 0-9"),
    ],
)
def test_non_json_numbers_and_unreachable_ids_are_refused_with_422(
    api_node: RunningNode, body: bytes, detail: str
) -> None:
    with api_node.client("client") as client:
        answer = client.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "invalid"
    assert answer.json()["detail"].startswith(detail)


def test_a_batch_with_an_id_taken_by_another_client_writes_none_of_its_jobs(
    api_node: RunningNode,
) -> None:
    with api_node.client("admin") as admin, api_node.client("client") as client:
        taken = admin.post("/v1/jobs", json={"id": "taken", "exec": "a.b", "client_id": "other"})
        assert taken.status_code == 202, taken.text
        api_node.wait_known("taken")
        batch = [{"id": "fresh-1", "exec": "a.b"}, {"id": "taken", "exec": "a.b"}]
        batch.append({"id": "fresh-2", "exec": "a.b"})
        refused = client.post("/v1/jobs:batch", json={"jobs": batch})
        assert refused.status_code == 409, refused.text
        assert refused.json() == {"error": "conflict", "detail": "job id 'taken' is taken"}
        assert api_node.submitted_keys() == [b"taken"]
        for job_id in ("fresh-1", "fresh-2"):
            assert admin.get(f"/v1/jobs/{job_id}").status_code == 404


def test_poison_records_are_rejected_and_the_leader_keeps_working(
    broker_api_node: RunningNode,
) -> None:
    kafka = broker_api_node.settings.kafka
    deep = b"[" * 50_000 + b"]" * 50_000
    poison = {
        b"deep": b'{"id":"deep","exec":"a.b","payload":' + deep + b"}",
        b"nan": b'{"id":"nan","exec":"a.b","payload":{"x":NaN}}',
        b"big": b'{"id":"big","exec":"a.b","payload":1,"max_attempts":2147483648}',
        b"a/b": b'{"id":"a/b","exec":"a.b","payload":1}',
        b"d300": b'{"id":"d300","exec":"a.b","payload":' + deep[:300] + deep[-300:] + b"}",
    }
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    for key, value in poison.items():
        producer.send(kafka.submit_topic, key=key, value=value)
    good = json.dumps({"id": "after", "exec": "a.b", "payload": None}).encode()
    producer.send(kafka.submit_topic, key=b"after", value=good).get(timeout=30)
    producer.close()

    reasons: dict[bytes, str] = {}
    for rejection in broker_api_node.rejections(len(poison)):
        assert rejection.key is not None
        reasons[rejection.key] = rejection.reason
    assert reasons == {
        b"deep": "value: nested too deep to parse (a payload may nest 32 levels)",
        b"nan": "payload.x: NaN is not JSON",
        b"big": "max_attempts: expected an integer <= 1000, got 2147483648",
        b"a/b": reasons[b"a/b"],
        b"d300": "payload: nested deeper than 32 levels",
    }
    assert reasons[b"a/b"].startswith("id: expected 1 to 128 of A-Z a-z 0-9")
    broker_api_node.wait_known("after")  # the good record after the poison
    assert broker_api_node.node.terms == 1, "a poison record ended the leader's term"


class _HangingArchive:
    """A Delta that does not answer (object storage hung)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def find_jobs(self, group: str, ids: object) -> dict[str, object]:
        self.release.wait(30)
        return {}

    def finished_since(self, group: str, since: float) -> object:
        return iter(())


def test_a_read_the_history_cannot_answer_in_time_is_a_503_not_a_404(
    api_node: RunningNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatch.api.routes import jobs as job_routes

    monkeypatch.setattr(job_routes, "ARCHIVE_LOOKUP_S", 0.3)
    archive = _HangingArchive()
    leader = api_node.node.leader()
    monkeypatch.setattr(leader, "archive", archive)
    try:
        with api_node.client("client") as client:
            started = time.monotonic()
            answer = client.get("/v1/jobs/forgotten-long-ago")
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"] == "unavailable"
            assert time.monotonic() - started < 5
            assert client.delete("/v1/jobs/forgotten-long-ago").status_code == 503
            # A submission does not wait on it: best effort, the job is accepted.
            accepted = client.post("/v1/jobs", json={"id": "fresh", "exec": "a.b"})
            assert accepted.status_code == 202, accepted.text
    finally:
        archive.release.set()

"""A real API leader writes the log (transactions, rejections); the tables equal its state."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import httpx
import pytest
from kafka import KafkaConsumer, KafkaProducer

from dispatch.api.leader import Leader
from dispatch.delta import tables as t
from dispatch.delta.snapshot import latest_snapshot
from dispatch.settings import Settings
from dispatch.warehouse import Warehouse
from tests.integration.api.conftest import RunningNode, poll_until, short_timeouts, start_node
from tests.integration.streaming.conftest import jobs_of, replay_after, run_stream, spark_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


@pytest.fixture
def leader_settings(topics: Settings) -> Settings:
    return short_timeouts(topics)


@contextmanager
def node_running(settings: Settings) -> Iterator[RunningNode]:
    running, server, thread = start_node(settings)
    try:
        yield running
    finally:
        server.should_exit = True
        thread.join(30)


def committed_rejections(settings: Settings, count: int, timeout_s: float = 20.0) -> None:
    """Wait until the leader's transactions have made `count` rejections visible."""
    consumer = KafkaConsumer(
        settings.kafka.rejected_topic,
        bootstrap_servers=settings.kafka.bootstrap,
        group_id=None,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    try:
        seen = 0
        deadline = time.monotonic() + timeout_s
        while seen < count:
            assert time.monotonic() < deadline, "the rejection was never committed"
            seen += sum(len(batch) for batch in consumer.poll(timeout_ms=500).values())
    finally:
        consumer.close()


def settle(worker: httpx.Client, job_id: str, assignment: dict[str, object], how: str) -> None:
    body: dict[str, object] = {"attempt": assignment["attempt"], "lease": assignment["lease"]}
    if how == "ack":
        answer = worker.post(f"/v1/jobs/{job_id}/ack", json={**body, "result": {"id": job_id}})
    else:
        answer = worker.post(
            f"/v1/jobs/{job_id}/fail", json={**body, "error": "flaky", "retryable": True}
        )
    assert answer.status_code == 200, answer.text


def drive_leader(settings: Settings) -> Leader:
    """test_leader_e2e's scenario (acked, failed and retried, cancelled, dead, one rejected
    submit); returns the stopped leader, whose state is exactly what it logged."""
    with (
        node_running(settings) as node,
        node.client("admin") as admin,
        node.client("worker") as worker,
    ):
        for job_id, extra in (
            ("d1", {"max_attempts": 1}), ("ok1", {}), ("ok2", {}), ("f1", {}),
            ("c1", {}), ("c2", {}),
        ):  # fmt: skip
            accepted = admin.post("/v1/jobs", json={"id": job_id, "exec": "a.b", **extra})
            assert accepted.status_code == 202, accepted.text
        first = {str(a["id"]): a for a in poll_until(worker, "w1", ["job.assign.a.b"], 4)}
        assert set(first) == {"d1", "ok1", "ok2", "f1"}
        settle(worker, "ok1", first["ok1"], "ack")
        settle(worker, "ok2", first["ok2"], "ack")
        settle(worker, "f1", first["f1"], "fail")
        assert admin.delete("/v1/jobs/c2").status_code == 200
        second = {str(a["id"]): a for a in poll_until(worker, "w1", ["job.assign.a.b"], 2)}
        assert set(second) == {"f1", "c1"}
        for job_id, assignment in second.items():
            settle(worker, job_id, assignment, "ack")
        deadline = time.monotonic() + 20
        while admin.get("/v1/jobs/d1").json()["status"] != "dead":
            assert time.monotonic() < deadline, "d1 never timed out"
            time.sleep(0.2)
        producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap)
        producer.send(settings.kafka.submit_topic, key=b"bad", value=b"{oops")
        producer.flush()
        producer.close()
        committed_rejections(settings, 1)
        leader = node.node.leader()
    deadline = time.monotonic() + 30
    while leader.running:
        assert time.monotonic() < deadline, "the leader did not stop"
        time.sleep(0.1)
    return leader


def test_the_tables_equal_a_real_leaders_state(
    leader_settings: Settings, spark: SparkSession
) -> None:
    leader = drive_leader(leader_settings)
    node_settings = leader_settings
    expected = {job.id: job.to_dict() for job in leader.core.jobs()}

    run_stream(node_settings, spark)
    assert jobs_of(spark_rows(spark, node_settings, t.JOBS)) == expected
    statuses = {job_id: job["status"] for job_id, job in expected.items()}
    assert statuses == {
        "d1": "dead", "ok1": "succeeded", "ok2": "succeeded", "f1": "succeeded",
        "c1": "succeeded", "c2": "cancelled",
    }  # fmt: skip
    [rejected] = spark_rows(spark, node_settings, t.REJECTED)
    assert rejected["job_id"] == "bad" and rejected["value"] == b"{oops"
    snapshot = latest_snapshot(Warehouse.of(node_settings), node_settings.dispatcher.group)
    assert snapshot is not None and snapshot.fence_epoch == leader.core.epoch
    assert {job.id: job.to_dict() for job in replay_after(node_settings, snapshot).jobs()} == (
        expected
    )

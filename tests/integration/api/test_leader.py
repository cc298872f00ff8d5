"""The leader's write-ahead log under a crash: `kill -9` the service mid-load, start it again,
and every job accepted before the crash ends terminal, none lost, none completed twice; and
across a change of leader, a submission is read once even when the consumer group's offsets
are behind (the position rides in the events log)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kafka import KafkaConsumer, KafkaProducer

import dispatch.api.leader
from dispatch.api.kafka_log import replay_events
from dispatch.auth import ensure_dev_keys
from dispatch.core.events import Completed, Enqueued
from dispatch.event_records import encode_batches
from dispatch.settings import Settings
from dispatch.stack.ports import free_port
from tests.integration.api.conftest import start_node
from tests.integration.api.processes import ServiceProcess, Workers

pytestmark = pytest.mark.integration


@pytest.fixture
def service(broker_api_settings: Settings, tmp_path: Path) -> Iterator[ServiceProcess]:
    ensure_dev_keys(broker_api_settings.auth)
    process = ServiceProcess(broker_api_settings, free_port(), tmp_path / "service.log")
    try:
        yield process
    finally:
        process.stop()


def test_kill_9_mid_load_loses_nothing_and_completes_nothing_twice(service: ServiceProcess) -> None:
    service.start()
    keys = ensure_dev_keys(service.settings.auth)
    accepted: list[str] = []
    with (
        Workers([service.url], keys["worker"], count=2),
        httpx.Client(
            base_url=service.url, headers={"Authorization": f"Bearer {keys['client']}"}, timeout=10
        ) as client,
    ):
        for batch in range(20):
            jobs = [{"id": f"c{batch}-{n}", "exec": "crash.test"} for n in range(50)]
            answer = client.post("/v1/jobs:batch", json={"jobs": jobs})
            assert answer.status_code == 202
            accepted += [job["id"] for job in answer.json()["jobs"]]
            if batch == 10:
                service.kill()
                service.start()
        deadline = time.monotonic() + 90
        pending = set(accepted)
        while pending:
            assert time.monotonic() < deadline, f"{len(pending)} jobs never finished"
            for job_id in list(pending)[:200]:
                answer = client.get(f"/v1/jobs/{job_id}")
                if answer.status_code == 200 and answer.json()["status"] == "succeeded":
                    pending.discard(job_id)
            time.sleep(0.2)

    completions = Counter(
        event.job_id
        for batch in replay_events(service.settings.kafka, client_id="crash-test-audit")
        for event in batch.events
        if isinstance(event, Completed)
    )
    assert set(completions) == set(accepted)
    assert max(completions.values()) == 1, "a job completed twice"


def rejections_in(settings: Settings) -> int:
    consumer = KafkaConsumer(
        settings.kafka.rejected_topic,
        bootstrap_servers=settings.kafka.bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        consumer_timeout_ms=3_000,
    )
    try:
        return sum(1 for _ in consumer)
    finally:
        consumer.close()


def test_a_new_leader_reads_on_where_the_log_says_though_the_group_offsets_lag(
    broker_api_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The group's offsets are sent with the first commit of a term and not again.
    monkeypatch.setattr(dispatch.api.leader, "GROUP_OFFSETS_EVERY_S", 3600.0)
    kafka = broker_api_settings.kafka
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    try:
        for term, job_id in enumerate(["first", "second"]):
            running, server, thread = start_node(broker_api_settings)
            try:
                if term == 0:
                    producer.send(kafka.submit_topic, key=b"bad", value=b"{not json").get(30)
                good = json.dumps({"id": job_id, "exec": "a.b", "payload": None}).encode()
                producer.send(kafka.submit_topic, key=job_id.encode(), value=good).get(30)
                running.wait_known(job_id)
            finally:
                server.should_exit = True
                thread.join(30)
    finally:
        producer.close()
    # The second leader started after the bad record's rejection, with the group's offsets
    # from before it: reading from those would have rejected it again.
    assert rejections_in(broker_api_settings) == 1
    enqueued = [
        event.job_id
        for batch in replay_events(kafka, client_id="check")
        for event in batch.events
        if isinstance(event, Enqueued)
    ]
    assert sorted(enqueued) == ["first", "second"]


def test_a_poison_events_record_is_skipped_by_the_rebuild_and_the_leader_serves(
    broker_api_settings: Settings,
) -> None:
    # Only leaders may write dispatch.events; a producer that bypassed the topic's ACLs must
    # still not keep every node from leading (the streaming fold skips the same records).
    kafka = broker_api_settings.kafka
    group = broker_api_settings.dispatcher.group
    forged = Completed(
        epoch=1, at=time.time(), job_id="never-submitted", worker_id="w", attempt=1, lease="1.x"
    )
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    try:
        producer.send(kafka.events_topic, key=group.encode(), value=b"{not an events batch").get(30)
        for record in encode_batches(group, 1, [forged]):
            producer.send(kafka.events_topic, key=group.encode(), value=record).get(30)
    finally:
        producer.close()
    running, server, thread = start_node(broker_api_settings)
    try:
        leader = running.node.leader()
        assert leader.skipped_events == 1
        assert leader.core.job("never-submitted") is None
        with running.client("client") as client:
            answer = client.post("/v1/jobs", json={"id": "after-poison", "exec": "a.b"})
            assert answer.status_code == 202
        running.wait_known("after-poison")
    finally:
        server.should_exit = True
        thread.join(30)

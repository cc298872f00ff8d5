"""A 3-broker KRaft cluster from the cached jars: replicated topics, kill -9 of a partition
leader under acks=all and transactional writes, and external brokers `dispatch up` leaves alone.

One cluster for the module (its start is most of the time); each test starts any node a
previous test killed, and the module stops every node by the pid it started, even on failure.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError

from dispatch.api.leader_io import TransactionalLog, open_event_log
from dispatch.api.submit_producer import SubmitProducer, SubmitUnavailable
from dispatch.bench.chaos import read_topic
from dispatch.core.commands import SubmitRequest
from dispatch.settings import Settings, load_settings, with_namespace
from dispatch.stack.broker import Broker, KafkaCluster, create_topics
from dispatch.stack.local import LocalStack
from dispatch.stack.plan import StackPlan
from dispatch.stack.ports import free_port, free_port_run

pytestmark = pytest.mark.integration

TRANSACTION_STATE = "__transaction_state"
CONSUMER_OFFSETS = "__consumer_offsets"


@dataclass
class Cluster:
    settings: Settings
    kafka: KafkaCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    var = tmp_path_factory.mktemp("cluster-var")
    first = free_port_run(6)
    settings = load_settings(
        paths={"var": str(var), "warehouse": str(var / "delta")},
        kafka={
            "brokers": 3,
            "bootstrap": f"127.0.0.1:{first}",
            "controller_port": first + 1,
            "heap": "256m",
            "start_timeout_s": 150.0,
        },
    )
    kafka = KafkaCluster(settings)
    try:
        kafka.start()
        yield Cluster(settings, kafka)
    finally:
        # The data is thrown away: no controlled shutdown to wait for.
        kafka.stop(timeout_s=3.0)


@pytest.fixture
def healthy(cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    """Every node running (a previous test may have killed one), and this test's topics."""
    cluster.kafka.start()
    namespace = f"c-{request.node.name[:40]}".replace("[", "-").replace("]", "")
    settings = with_namespace(cluster.settings, namespace, tmp_path)
    create_topics(settings.kafka)
    return settings


def _admin(settings: Settings) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap, client_id="test-cluster")


def _replicas(admin: KafkaAdminClient, topics: list[str]) -> dict[str, set[int]]:
    """Replica count of every partition of each topic."""
    return {
        topic["name"]: {len(partition["replica_nodes"]) for partition in topic["partitions"]}
        for topic in admin.describe_topics(topics)
    }


def _min_isr(admin: KafkaAdminClient, topics: list[str]) -> dict[str, str]:
    resources = [
        ConfigResource(ConfigResourceType.TOPIC, topic, configs={"min.insync.replicas": None})
        for topic in topics
    ]
    described = admin.describe_configs(resources, config_filter="all")
    return {topic: described["topic"][topic]["min.insync.replicas"]["value"] for topic in topics}


def test_a_cluster_replicates_the_topics_and_the_transactions_three_times(
    healthy: Settings,
) -> None:
    kafka = healthy.kafka
    # The leader's first transaction (with the group's offsets) makes the internal topics;
    # on a loaded machine their creation may outlast the leader's 5 s call deadline once.
    for attempt in range(3):
        try:
            log = open_event_log(kafka, "replicated", "test-replicated")
        except (KafkaError, KafkaException):
            if attempt == 2:
                raise
            continue
        try:
            log.commit([b"first"], [], {0: 0})
            break
        except (KafkaError, KafkaException):
            if attempt == 2:
                raise
        finally:
            log.close()
    admin = _admin(healthy)
    try:
        topics = [*kafka.topics, TRANSACTION_STATE, CONSUMER_OFFSETS]
        assert _replicas(admin, topics) == {topic: {3} for topic in topics}
        assert _min_isr(admin, [*kafka.topics, TRANSACTION_STATE]) == {
            topic: "2" for topic in [*kafka.topics, TRANSACTION_STATE]
        }
    finally:
        admin.close()


def test_up_with_external_brokers_starts_none_and_creates_the_topics(
    healthy: Settings, cluster: Cluster, tmp_path: Path
) -> None:
    # Topics of their own, not yet made: `up` must create them on the external cluster.
    fresh = with_namespace(healthy, "external", tmp_path)
    external = fresh.kafka.model_copy(update={"external": True})
    settings = fresh.model_copy(
        update={"kafka": external, "api": fresh.api.model_copy(update={"ports": [free_port()]})}
    )
    pids = {node.name: node.running() for node in cluster.kafka.nodes}
    stack = LocalStack(settings, StackPlan(streaming=False, workers=0))
    try:
        # The bootstrap ports are the cluster's, taken: a local start would refuse them.
        created = stack.up()
        assert created == sorted(external.topics)
        assert [c.name for c in stack.status()] == [f"api-{settings.api.ports[0]}"]
        assert not (settings.broker_dir).exists()
    finally:
        stopped = stack.down()
    assert stopped == [f"api-{settings.api.ports[0]}"]
    assert {node.name: node.running() for node in cluster.kafka.nodes} == pids
    admin = _admin(settings)
    try:
        assert _replicas(admin, list(external.topics)) == {t: {3} for t in external.topics}
    finally:
        admin.close()


# --- kill -9 under load --------------------------------------------------------------------------


@dataclass
class Writer:
    """One writer thread's acknowledged records, with when each was acknowledged."""

    name: str
    acked: list[tuple[str, float]] = field(default_factory=list)
    failures: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def acked_after(self, moment: float) -> bool:
        return any(at > moment for _id, at in self.acked)

    def pause_around(self, moment: float) -> float:
        """The longest wait for an acknowledgement across `moment`: from the last one before
        it (or `moment`) to the first one after it."""
        before = [at for _id, at in self.acked if at <= moment]
        after = [at for _id, at in self.acked if at > moment]
        start = max(before, default=moment)
        return min(after) - start if after else float("inf")


def _submit(kafka_settings: Settings, writer: Writer) -> None:
    """The REST path's producer (librdkafka, acks=all, idempotent), one submission at a time."""

    async def run() -> None:
        producer = SubmitProducer(kafka_settings.kafka, "test-kill-submit")
        number = 0
        try:
            while not writer.stop.is_set():
                job_id = f"s-{number}"
                number += 1
                try:
                    await producer.send([SubmitRequest(id=job_id, exec="t.kill", payload={})])
                except SubmitUnavailable:
                    writer.failures += 1
                    continue
                writer.acked.append((job_id, time.monotonic()))
                await asyncio.sleep(0.01)
        finally:
            producer.close(timeout_s=5.0)

    asyncio.run(run())


def _commit(settings: Settings, writer: Writer) -> None:
    """The leader's transactional producer: one record per transaction; after a failed
    commit a new one fences the old and goes on (as a new leader term does)."""
    log: TransactionalLog | None = None
    number = 0
    try:
        while not writer.stop.is_set():
            record_id = f"t-{number}"
            number += 1
            try:
                if log is None:
                    log = open_event_log(settings.kafka, "kill", "test-kill-txn")
                log.commit([record_id.encode()], [])
            except (KafkaError, KafkaException):
                writer.failures += 1
                if log is not None:
                    log.close()
                log = None
                time.sleep(0.05)
                continue
            writer.acked.append((record_id, time.monotonic()))
            time.sleep(0.01)
    finally:
        if log is not None:
            log.close()


def _read_committed(settings: Settings, topic: str, keys: bool) -> set[str]:
    """The keys (or values) of every committed record of `topic`, as text."""
    raws = (record.key if keys else record.value for record in read_topic(settings, topic, 30.0))
    return {raw.decode() for raw in raws if raw is not None}


def _partition_leader(settings: Settings, topic: str) -> int:
    admin = _admin(settings)
    try:
        [described] = admin.describe_topics([topic])
    finally:
        admin.close()
    return int(described["partitions"][0]["leader_id"])


def _leader_if_answered(settings: Settings, topic: str) -> int | None:
    """The partition's leader, or None while the admin's broker was the one just killed."""
    try:
        return _partition_leader(settings, topic)
    except KafkaError:
        return None


def test_kill_9_of_a_partition_leader_loses_nothing_acknowledged(
    healthy: Settings, cluster: Cluster
) -> None:
    submit, commit = Writer("acks=all submit producer"), Writer("transactional event log")
    threads = [
        threading.Thread(target=_submit, args=(healthy, submit), name="kill-submit"),
        threading.Thread(target=_commit, args=(healthy, commit), name="kill-commit"),
    ]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while not (submit.acked and commit.acked):
            assert time.monotonic() < deadline, "the writers never got going"
            time.sleep(0.05)
        time.sleep(0.5)
        leader_id = _partition_leader(healthy, healthy.kafka.events_topic)
        victim: Broker = cluster.kafka.nodes[leader_id - 1]
        record = victim.running()
        assert record is not None
        os.kill(record.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        deadline = killed_at + 60
        while not (submit.acked_after(killed_at) and commit.acked_after(killed_at)):
            assert time.monotonic() < deadline, (
                f"writing did not resume within 60 s of the kill of node {leader_id} "
                f"(submit: {submit.acked_after(killed_at)}, commit: "
                f"{commit.acked_after(killed_at)})"
            )
            time.sleep(0.05)
        time.sleep(1.0)  # writing goes on on the survivors
    finally:
        for writer in (submit, commit):
            writer.stop.set()
        for thread in threads:
            thread.join(60)
    pauses = {w.name: round(w.pause_around(killed_at), 2) for w in (submit, commit)}
    print(f"killed node {leader_id} (leader of {healthy.kafka.events_topic}); pauses: {pauses}")
    assert _partition_leader(healthy, healthy.kafka.events_topic) != leader_id
    assert all(pause < 30 for pause in pauses.values()), pauses
    acked_submits = {job_id for job_id, _at in submit.acked}
    assert acked_submits <= _read_committed(healthy, healthy.kafka.submit_topic, keys=True)
    committed = {record_id for record_id, _at in commit.acked}
    assert committed <= _read_committed(healthy, healthy.kafka.events_topic, keys=False)


@pytest.mark.parametrize("leader_client", ["librdkafka", "kafka-python"])
def test_the_event_log_outlives_the_death_of_its_transaction_coordinator(
    healthy: Settings, cluster: Cluster, leader_client: str
) -> None:
    """The leader's producer goes on in the same term (no new `init_transactions`, no
    rebuild) once the cluster moved the coordinator: kafka-python on its own forgot the
    transaction's first request and the commit timed out (`CoordinatorRetryingClient`)."""
    kafka = healthy.kafka.model_copy(update={"leader_client": leader_client})
    log = open_event_log(kafka, f"coordinator-{leader_client}", "test-coordinator-kill")
    try:
        log.commit([b"before"], [])
        # One partition of transaction state: its leader coordinates every transaction.
        coordinator = _partition_leader(healthy, TRANSACTION_STATE)
        record = cluster.kafka.nodes[coordinator - 1].running()
        assert record is not None
        os.kill(record.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while _leader_if_answered(healthy, TRANSACTION_STATE) in (coordinator, -1, None):
            assert time.monotonic() < deadline, "the transaction state never got a new leader"
            time.sleep(0.1)
        try:
            log.commit([b"after"], [])
        except KafkaException:
            # librdkafka may time the commit in flight out while the partitions move (seen
            # once in CI on a loaded machine): the term then ends and the next one goes on, as
            # the leader's node does. kafka-python's term must survive (no except for it).
            if leader_client != "librdkafka":
                raise
            log.close()
            log = open_event_log(kafka, f"coordinator-{leader_client}", "test-coordinator-kill")
            log.commit([b"after"], [])
        log.commit([b"and on"], [])
    finally:
        log.close()
    assert {b"before", b"after", b"and on"} <= {
        record.value for record in read_topic(healthy, healthy.kafka.events_topic, 30.0)
    }

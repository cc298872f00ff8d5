"""The broker's pure parts: cluster ids the storage tool accepts, the server properties of a
single broker and of each node of a local cluster."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from dispatch.settings import load_settings
from dispatch.stack.broker import (
    NodeAddress,
    cluster_nodes,
    kafka_uuid,
    server_properties,
    under_replicated,
)


def test_cluster_ids_are_16_bytes_and_never_look_like_an_option() -> None:
    # One id in 64 would start with '-' by chance; a few thousand draws catch a regression.
    for _ in range(5000):
        cluster_id = kafka_uuid()
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


# --- server properties ---------------------------------------------------------------------------

SINGLE_NODE_BEFORE_CLUSTERS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.quorum.voters": "1@127.0.0.1:19093",
    "listeners": "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093",
    "advertised.listeners": "PLAINTEXT://127.0.0.1:19092",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "log.dirs": "/data",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "log.retention.hours": "168",
    "replica.fetch.max.bytes": str(16 * 1024 * 1024),
}
"""What the single broker ran with before clusters existed (the session broker of the tests
and every single-broker stack must not change)."""


def test_one_broker_keeps_exactly_its_properties() -> None:
    kafka = load_settings(kafka={"bootstrap": "127.0.0.1:19092", "controller_port": 19093}).kafka
    assert server_properties(kafka, Path("/data")) == SINGLE_NODE_BEFORE_CLUSTERS


def test_each_cluster_node_listens_on_its_own_ports_in_one_quorum() -> None:
    kafka = load_settings(
        kafka={"brokers": 3, "bootstrap": "127.0.0.1:19092", "controller_port": 19093}
    ).kafka
    voters = "1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097"
    for node_id, port in ((1, 19092), (2, 19094), (3, 19096)):
        properties = server_properties(kafka, Path(f"/data/{node_id}"), node_id)
        assert properties["node.id"] == str(node_id)
        assert properties["controller.quorum.voters"] == voters
        assert properties["listeners"] == (
            f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{port + 1}"
        )
        assert properties["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{port}"
        assert properties["process.roles"] == "broker,controller"


def test_a_cluster_replicates_internal_topics_like_the_dispatchers() -> None:
    kafka = load_settings(kafka={"brokers": 3}).kafka
    properties = server_properties(kafka, Path("/data"), 2)
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "share.coordinator.state.topic.replication.factor",
        "default.replication.factor",
    ):
        assert properties[key] == "3", key
    for key in (
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.min.isr",
        "min.insync.replicas",
    ):
        assert properties[key] == "2", key
    assert properties["unclean.leader.election.enable"] == "false"
    # A dead node is fenced (its partitions re-led, the ISRs shrunk) within a few seconds.
    assert int(properties["broker.session.timeout.ms"]) <= 2000
    assert int(properties["broker.heartbeat.interval.ms"]) * 8 <= int(
        properties["broker.session.timeout.ms"]
    )
    # A dead active controller is replaced in about 1.5 s (Kafka's defaults: about 3 s).
    assert int(properties["controller.quorum.fetch.timeout.ms"]) <= 1000
    assert int(properties["controller.quorum.election.timeout.ms"]) <= 500


def test_explicit_replication_settings_reach_the_internal_topics() -> None:
    kafka = load_settings(
        kafka={"brokers": 3, "replication_factor": 2, "min_insync_replicas": 1}
    ).kafka
    properties = server_properties(kafka, Path("/data"), 1)
    assert properties["transaction.state.log.replication.factor"] == "2"
    assert properties["transaction.state.log.min.isr"] == "1"


def test_cluster_nodes_are_numbered_from_one_in_bootstrap_order() -> None:
    kafka = load_settings(
        kafka={
            "brokers": 2,
            "bootstrap": "127.0.0.1:30000,127.0.0.1:31000",
            "controller_port": 32000,
        }
    ).kafka
    assert cluster_nodes(kafka) == [
        NodeAddress(1, "127.0.0.1", 30000, 32000),
        NodeAddress(2, "127.0.0.1", 31000, 32002),
    ]


# --- replicas in sync ----------------------------------------------------------------------------


def _partition(index: int, leader: int, replicas: list[int], isr: list[int]) -> dict[str, Any]:
    return {
        "partition_index": index,
        "leader_id": leader,
        "replica_nodes": replicas,
        "isr_nodes": isr,
    }


def test_partitions_short_of_in_sync_replicas_or_leaderless_are_named() -> None:
    described = [
        {
            "name": "b",
            "partitions": [
                _partition(0, 1, [1, 2, 3], [1, 2, 3]),
                _partition(1, 2, [1, 2, 3], [2, 3]),
            ],
        },
        {"name": "a", "partitions": [_partition(0, -1, [1, 2, 3], [])]},
        {"name": "single", "partitions": [_partition(0, 1, [1], [1])]},
    ]
    assert under_replicated(described) == ["a[0]", "b[1]"]


def test_a_topic_without_partitions_has_none_out_of_sync() -> None:
    assert under_replicated([{"name": "__consumer_offsets", "partitions": []}]) == []

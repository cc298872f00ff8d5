"""`kafka.brokers`, `replication_factor`, `min_insync_replicas` and `external`: derived
defaults, the local cluster's port scheme, and refusals that name the setting."""

from __future__ import annotations

import pytest

from dispatch.settings import ConfigError, load_settings, to_environment


def test_one_broker_by_default_with_one_replica() -> None:
    kafka = load_settings().kafka
    assert (kafka.brokers, kafka.replication_factor, kafka.min_insync_replicas) == (1, 1, 1)
    assert kafka.external is False
    assert kafka.bootstrap == "127.0.0.1:9092"
    assert kafka.controller_ports == [9093]


@pytest.mark.parametrize(
    ("brokers", "replicas", "min_isr"),
    [(1, 1, 1), (2, 2, 1), (3, 3, 2), (5, 3, 2)],
)
def test_replication_is_derived_from_the_broker_count(
    brokers: int, replicas: int, min_isr: int
) -> None:
    kafka = load_settings(kafka={"brokers": brokers}).kafka
    assert (kafka.replication_factor, kafka.min_insync_replicas) == (replicas, min_isr)


def test_a_local_cluster_bootstrap_lists_every_broker() -> None:
    kafka = load_settings(kafka={"brokers": 3}).kafka
    assert kafka.bootstrap == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"
    assert kafka.controller_ports == [9093, 9095, 9097]
    assert kafka.servers == [("127.0.0.1", 9092), ("127.0.0.1", 9094), ("127.0.0.1", 9096)]
    # The first broker stays the one `host` / `port` name.
    assert (kafka.host, kafka.port) == ("127.0.0.1", 9092)


def test_an_explicit_list_of_brokers_is_kept() -> None:
    bootstrap = "127.0.0.1:30000,127.0.0.1:30010,127.0.0.1:30020"
    kafka = load_settings(kafka={"brokers": 3, "bootstrap": bootstrap}).kafka
    assert kafka.bootstrap == bootstrap


def test_the_derived_settings_reach_a_child_process_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = load_settings(kafka={"brokers": 3})
    for name, value in to_environment(settings).items():
        monkeypatch.setenv(name, value)
    assert load_settings().kafka == settings.kafka


def test_external_brokers_keep_their_bootstrap_and_derive_from_their_count() -> None:
    bootstrap = "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    kafka = load_settings(kafka={"external": True, "brokers": 3, "bootstrap": bootstrap}).kafka
    assert kafka.bootstrap == bootstrap
    assert (kafka.replication_factor, kafka.min_insync_replicas) == (3, 2)


def test_one_external_address_is_not_expanded() -> None:
    kafka = load_settings(kafka={"external": True, "brokers": 3, "bootstrap": "k:9092"}).kafka
    assert kafka.bootstrap == "k:9092"


@pytest.mark.parametrize(
    ("kafka", "message"),
    [
        ({"brokers": 3, "min_insync_replicas": 3, "replication_factor": 2}, "exceeds replication"),
        ({"replication_factor": 3}, "exceeds brokers"),
        ({"bootstrap": "a:1,b:2"}, "set brokers to 2"),
        ({"brokers": 3, "controller_port": 9094}, "collide"),
        ({"brokers": 9, "bootstrap": "127.0.0.1:65530", "controller_port": 65531}, "65535"),
        ({"brokers": 0}, "brokers"),
        ({"brokers": 10}, "brokers"),
    ],
)
def test_impossible_cluster_settings_are_refused(kafka: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(kafka=kafka)

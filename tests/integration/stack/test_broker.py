"""The embedded broker from the cached jars: failures that say where to look."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dispatch.settings import Settings, load_settings
from dispatch.stack.broker import Broker, BrokerError, server_properties
from dispatch.stack.ports import free_port

pytestmark = pytest.mark.integration


def _own_broker_settings(tmp_path: Path, **kafka: object) -> Settings:
    return load_settings(
        paths={"var": str(tmp_path / "var")},
        kafka={
            "bootstrap": f"127.0.0.1:{free_port()}",
            "controller_port": free_port(),
            "start_timeout_s": 60.0,
            **kafka,
        },
    )


def test_the_session_broker_runs_transactions_on_one_node(kafka_broker: Broker) -> None:
    properties = kafka_broker.properties_file.read_text()
    assert "transaction.state.log.replication.factor=1" in properties
    assert "transaction.state.log.num.partitions=1" in properties
    assert kafka_broker.running() is not None
    # The broker logs through log4j (not slf4j NOP): its start is in the log file.
    assert "Kafka Server started" in kafka_broker.log_file.read_text()


def test_a_broker_that_cannot_start_names_its_log_file(tmp_path: Path) -> None:
    broker = Broker(_own_broker_settings(tmp_path, heap="1m"))
    with pytest.raises(BrokerError) as raised:
        broker.start()
    assert str(broker.log_file) in str(raised.value)
    assert broker.running() is None


def test_a_taken_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        broker = Broker(_own_broker_settings(tmp_path, bootstrap=f"127.0.0.1:{port}"))
        with pytest.raises(BrokerError, match=f"port {port}"):
            broker.start()
    assert broker.running() is None


def test_server_properties_listen_on_the_configured_loopback_ports() -> None:
    settings = load_settings(kafka={"bootstrap": "127.0.0.1:19092", "controller_port": 19093})
    properties = server_properties(settings.kafka, Path("/data"))
    assert properties["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert properties["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert properties["log.dirs"] == "/data"
    assert properties["auto.create.topics.enable"] == "false"

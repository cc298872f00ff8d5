"""A single-node Apache Kafka broker in KRaft mode, started from the cached Maven jars.

Storage is formatted once (the cluster id lives in the data folder's meta.properties), the
server properties are written afresh on every start from the settings, and the JVM runs as a
managed process whose pid file lets `dispatch down` stop it from another shell.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.errors import KafkaError, TopicAlreadyExistsError

from dispatch.settings import PROJECT_ROOT, KafkaSettings, Settings
from dispatch.stack.jars import jar_paths
from dispatch.stack.process import ManagedProcess, ProcessError, ProcessRecord

LOG4J_CONFIG = PROJECT_ROOT / "stack" / "log4j2-broker.properties"
NODE_ID = 1


class BrokerError(ProcessError):
    """The broker did not start or answer; the message names its log file."""


def kafka_uuid() -> str:
    """A cluster id as `kafka-storage.sh random-uuid` makes it, without starting a JVM: 16
    random bytes in URL-safe base64 without padding, never starting with '-' (Kafka's Uuid
    rule: the storage tool would read such an id as an option)."""
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not candidate.startswith("-"):
            return candidate


def server_properties(kafka: KafkaSettings, data_dir: Path) -> dict[str, str]:
    """Combined broker+controller on loopback, sized for one node on two cores."""
    controller = f"{kafka.host}:{kafka.controller_port}"
    return {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.voters": f"{NODE_ID}@{controller}",
        "listeners": f"PLAINTEXT://{kafka.bootstrap},CONTROLLER://{controller}",
        "advertised.listeners": f"PLAINTEXT://{kafka.bootstrap}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir),
        # One node: every internal topic has one replica. One partition each, because the
        # default 50 makes the first transaction or consumer group wait for 50 leaders.
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
        # Topics are created by `dispatch up` with their settings; a typo must not create one.
        "auto.create.topics.enable": "false",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "log.retention.hours": str(kafka.retention_hours),
        # Fetches must fit the largest record a topic accepts (TOPIC_MAX_MESSAGE_BYTES).
        "replica.fetch.max.bytes": str(16 * 1024 * 1024),
    }


class Broker:
    """The embedded broker of one settings object."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.kafka = settings.kafka
        self.home = settings.broker_dir
        self.data_dir = self.home / "data"
        self.properties_file = self.home / "server.properties"
        self.process = ManagedProcess("broker", self.home, self.home / "broker.log")

    @property
    def log_file(self) -> Path:
        return self.process.log_file

    def _java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise BrokerError(
                "Java is not installed (Java 17+ is needed): run scripts/bootstrap.sh"
            )
        return java

    def _classpath(self) -> str:
        return ":".join(str(path) for path in jar_paths("broker", self.settings.jar_cache))

    def _write_properties(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        lines = [
            f"{key}={value}" for key, value in server_properties(self.kafka, self.data_dir).items()
        ]
        self.properties_file.write_text("\n".join(lines) + "\n")

    def _format_storage(self) -> None:
        if (self.data_dir / "meta.properties").is_file():
            return
        command = [
            self._java(), "-cp", self._classpath(),
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "kafka.tools.StorageTool", "format",
            "-t", kafka_uuid(), "-c", str(self.properties_file),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise BrokerError(f"formatting KRaft storage in {self.data_dir} failed:\n{output}")

    def _port_taken(self, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.5)
            return probe.connect_ex((self.kafka.host, port)) == 0

    def running(self) -> ProcessRecord | None:
        return self.process.record()

    def start(self) -> ProcessRecord:
        """Start the broker and return once it answers metadata requests."""
        if (record := self.running()) is not None:
            raise BrokerError(
                f"the broker is already running (pid {record.pid}); see {self.log_file}"
            )
        for port in (self.kafka.port, self.kafka.controller_port):
            if self._port_taken(port):
                raise BrokerError(
                    f"port {port} on {self.kafka.host} is taken by another process; "
                    "stop it or change kafka.bootstrap / kafka.controller_port"
                )
        self._write_properties()
        self._format_storage()
        command = [
            self._java(), f"-Xms{self.kafka.heap}", f"-Xmx{self.kafka.heap}",
            "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp", self._classpath(), "kafka.Kafka", str(self.properties_file),
        ]  # fmt: skip
        record = self.process.start(command)
        try:
            self.wait_ready(self.kafka.start_timeout_s)
        except BrokerError:
            self.process.stop(timeout_s=10.0)
            raise
        return record

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            code = self.process.exit_code()
            if code is not None or self.running() is None:
                raise BrokerError(
                    f"the broker exited (code {code}) during start; see {self.log_file}:\n"
                    f"{self.process.log_tail()}"
                )
            # kafka-python leaks a socket for each refused connection, so it is only asked
            # once the listener accepts TCP connections.
            if not self._port_taken(self.kafka.port):
                time.sleep(0.2)
                continue
            try:
                admin = KafkaAdminClient(
                    bootstrap_servers=self.kafka.bootstrap,
                    request_timeout_ms=5000,
                    client_id="dispatch-ready-check",
                )
                try:
                    admin.list_topics()
                    return
                finally:
                    admin.close()
            except KafkaError as error:
                last_error = repr(error)
            time.sleep(0.5)
        raise BrokerError(
            f"the broker did not answer within {timeout_s:.0f}s ({last_error}); see {self.log_file}"
        )

    def stop(self) -> bool:
        # Controlled shutdown of one node normally takes a few seconds.
        return self.process.stop(timeout_s=30.0)


TOPIC_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Per-topic record limit: an events record batches a whole transaction, and one submission
may carry a payload of `api.max_payload_bytes` (the broker's default is 1 MiB)."""


def create_topics(kafka: KafkaSettings, topics: dict[str, int] | None = None) -> list[str]:
    """Create the dispatcher's topics (or the given ones) if missing; returns those created."""
    wanted = topics if topics is not None else kafka.topics
    configs = {
        "retention.ms": str(kafka.retention_hours * 3600 * 1000),
        "min.insync.replicas": "1",
        "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES),
    }
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap, client_id="dispatch-topics")
    try:
        existing = set(admin.list_topics())
        missing = {
            name: {"num_partitions": partitions, "replication_factor": 1, "configs": configs}
            for name, partitions in wanted.items()
            if name not in existing
        }
        if missing:
            # Another process may create the same topic between our list and our create.
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(missing, timeout_ms=30_000, wait_for_metadata=True)
        return sorted(missing)
    finally:
        admin.close()

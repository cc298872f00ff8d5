"""Apache Kafka in KRaft mode, started from the cached Maven jars: one node, or a cluster of
`kafka.brokers` nodes on loopback.

Storage is formatted once (the cluster id lives in the data folder's meta.properties), the
server properties are written afresh on every start from the settings, and each JVM runs as a
managed process whose pid file lets `dispatch down` stop it from another shell.

A cluster is made of combined broker+controller nodes whose controllers form a static quorum
of every node: three JVMs survive the loss of any one (two voters of three remain), where a
dedicated controller would either be a single point of failure (one JVM) or double the JVMs on
a two-core machine (three). Node n (1-based) listens on the n-th `kafka.bootstrap` address and
on `kafka.controller_ports[n-1]`, keeps its data in `var/kafka/node-n/` and its pid file and
log there (docs/deployment.md, "Kafka profiles"). One node keeps the layout it always had
(`var/kafka/{data,broker.pid,broker.log}`).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient
from kafka.errors import KafkaError, TopicAlreadyExistsError

from dispatch.settings import PROJECT_ROOT, KafkaSettings, Settings
from dispatch.stack import class_sharing
from dispatch.stack.jars import JarError, jar_paths
from dispatch.stack.process import ManagedProcess, ProcessError, ProcessRecord

LOG4J_CONFIG = PROJECT_ROOT / "stack" / "log4j2-broker.properties"
NODE_ID = 1
"""The id of a single broker (and of the first node of a cluster)."""

SESSION_TIMEOUT_MS = 2000
"""A cluster node the controller has not heard from this long is fenced: its partitions get
new leaders and it leaves their ISRs. Kafka's 9 s default would be the pause of every client
after a kill -9 (acks=all writes wait for the dead follower until then). Killing the
leader's transaction coordinator: at 3 s the new term's `init_transactions` sometimes still
found no coordinator and the pause doubled, at 2 s it never did, and no live node was fenced
on a loaded machine (BENCHMARKS.md, *One broker of three killed*)."""

HEARTBEAT_INTERVAL_MS = 250
"""Eight heartbeats per session timeout, so a few delayed by a GC pause or a busy two-core
machine do not fence a live node."""

QUORUM_FETCH_TIMEOUT_MS = 1000
QUORUM_ELECTION_TIMEOUT_MS = 500

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class NodeAddress:
    """Where one local node listens."""

    node_id: int
    host: str
    port: int
    controller_port: int

    @property
    def listener(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def controller(self) -> str:
        return f"{self.host}:{self.controller_port}"


def cluster_nodes(kafka: KafkaSettings) -> list[NodeAddress]:
    """The nodes the local stack runs: node n on the n-th bootstrap address and controller
    port (ids from 1, as `node.id`)."""
    return [
        NodeAddress(number, host, port, controller)
        for number, ((host, port), controller) in enumerate(
            zip(kafka.servers, kafka.controller_ports, strict=True), start=1
        )
    ]


def server_properties(
    kafka: KafkaSettings, data_dir: Path, node_id: int = NODE_ID
) -> dict[str, str]:
    """Node `node_id` of the local cluster: combined broker+controller on loopback, sized for
    two cores; with one broker, exactly the single node it has always been."""
    nodes = cluster_nodes(kafka)
    node = nodes[node_id - 1]
    voters = ",".join(f"{other.node_id}@{other.controller}" for other in nodes)
    replicas, min_isr = str(kafka.replication_factor), str(kafka.min_insync_replicas)
    properties = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{node.listener},CONTROLLER://{node.controller}",
        "advertised.listeners": f"PLAINTEXT://{node.listener}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir),
        # Internal topics (consumer offsets, the transaction state the leader's transactions
        # live in) replicated like the dispatcher's own: a committed transaction must survive
        # what its records survive. One partition each, because the default 50 makes the
        # first transaction or consumer group wait for 50 leaders.
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
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
    if len(nodes) > 1:
        properties |= {
            "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
            "broker.heartbeat.interval.ms": str(HEARTBEAT_INTERVAL_MS),
            # The controllers' own failover (every node is one): a killed active controller is
            # noticed after the fetch timeout, then the others elect; Kafka's 2 s and 1 s put
            # about 3 s before any broker can be fenced at all.
            "controller.quorum.fetch.timeout.ms": str(QUORUM_FETCH_TIMEOUT_MS),
            "controller.quorum.election.timeout.ms": str(QUORUM_ELECTION_TIMEOUT_MS),
            "controller.quorum.election.backoff.max.ms": str(QUORUM_ELECTION_TIMEOUT_MS),
            # Stated, not left to the default: a replica that missed acknowledged records
            # never becomes leader (that would lose them), the partition waits instead.
            "unclean.leader.election.enable": "false",
        }
    return properties


class Broker:
    """One embedded node: the single broker of one settings object, or node `node_id` of its
    local cluster (`kafka.brokers` > 1)."""

    def __init__(
        self, settings: Settings, node_id: int = NODE_ID, java_options: Sequence[str] = ()
    ) -> None:
        """`java_options` come last on the broker's JVM command line (class_training makes
        the broker write its archive with them)."""
        self.settings = settings
        self.java_options = list(java_options)
        self.kafka = settings.kafka
        self.node = cluster_nodes(self.kafka)[node_id - 1]
        self.clustered = self.kafka.brokers > 1
        if self.clustered:
            self.home = settings.broker_dir / f"node-{node_id}"
            name = f"broker-{node_id}"
        else:
            self.home = settings.broker_dir
            name = "broker"
        self.data_dir = self.home / "data"
        self.properties_file = self.home / "server.properties"
        self.process = ManagedProcess(name, self.home, self.home / f"{name}.log")

    @property
    def name(self) -> str:
        return self.process.name

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
        return ":".join(str(path) for path in self._jars())

    def _jars(self) -> list[Path]:
        return jar_paths("broker", self.settings.jar_cache)

    def _sharing(self) -> list[str]:
        """Its class-data-sharing archive and compiler options (dispatch.stack.class_sharing)."""
        return class_sharing.java_options(self.settings, class_sharing.BROKER, self._jars())

    def _write_properties(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        properties = server_properties(self.kafka, self.data_dir, self.node.node_id)
        lines = [f"{key}={value}" for key, value in properties.items()]
        self.properties_file.write_text("\n".join(lines) + "\n")

    def cluster_id(self) -> str:
        if not self.clustered:
            return kafka_uuid()
        # Every node of a cluster must be formatted with the same id; a node whose data
        # folder was removed rejoins with it.
        id_file = self.settings.broker_dir / "cluster.id"
        if not id_file.is_file():
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(kafka_uuid() + "\n")
        return id_file.read_text().strip()

    def _format_storage(self) -> None:
        if (self.data_dir / "meta.properties").is_file():
            return
        # A short-lived tool: the client compiler (whatever `jvm.quick_start` says) and the
        # serial collector start it in a third of the time (2 s instead of 6 s on a loaded
        # two-core machine); the broker's archive covers its classes too (same jars).
        archive = [o for o in self._sharing() if o not in class_sharing.QUICK_START_OPTIONS]
        command = [
            self._java(), *archive, class_sharing.QUICK_START_OPTION, "-XX:+UseSerialGC",
            "-cp", self._classpath(),
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "kafka.tools.StorageTool", "format",
            "-t", self.cluster_id(), "-c", str(self.properties_file),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise BrokerError(f"formatting KRaft storage in {self.data_dir} failed:\n{output}")

    def _port_taken(self, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.5)
            return probe.connect_ex((self.node.host, port)) == 0

    def running(self) -> ProcessRecord | None:
        return self.process.record()

    def start(self) -> ProcessRecord:
        """Start the broker and return once it answers metadata requests."""
        record = self.launch()
        try:
            self.wait_ready(self.kafka.start_timeout_s)
        except BrokerError:
            self.process.stop(timeout_s=10.0)
            raise
        return record

    def launch(self) -> ProcessRecord:
        """Start the JVM without waiting for it to answer (a cluster's nodes only answer once
        a majority of the controller quorum runs, so they are launched together)."""
        if (record := self.running()) is not None:
            raise BrokerError(
                f"the {self.name} is already running (pid {record.pid}); see {self.log_file}"
            )
        self.check_ports()
        self.prepare()
        command = [
            self._java(), f"-Xms{self.kafka.heap}", f"-Xmx{self.kafka.heap}",
            "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", *self._sharing(), *self.java_options,
            "-cp", self._classpath(), "kafka.Kafka", str(self.properties_file),
        ]  # fmt: skip
        return self.process.start(command)

    def prepare(self) -> None:
        """Write the server properties and format the storage if it never was."""
        self._write_properties()
        self._format_storage()

    def check_ports(self) -> None:
        """Raise BrokerError if another process listens on one of this node's ports."""
        for port in (self.node.port, self.node.controller_port):
            if self._port_taken(port):
                raise BrokerError(
                    f"port {port} on {self.node.host} is taken by another process; "
                    "stop it or change kafka.bootstrap / kafka.controller_port "
                    "(or set kafka.external = true to use the brokers already there)"
                )

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            code = self.process.exit_code()
            if code is not None or self.running() is None:
                raise BrokerError(
                    f"the {self.name} exited (code {code}) during start; see {self.log_file}:\n"
                    f"{self.process.log_tail()}"
                )
            # kafka-python leaks a socket for each refused connection, so it is only asked
            # once the listener accepts TCP connections.
            if not self._port_taken(self.node.port):
                time.sleep(0.2)
                continue
            try:
                admin = KafkaAdminClient(
                    bootstrap_servers=self.node.listener,
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
            f"the {self.name} did not answer within {timeout_s:.0f}s ({last_error}); "
            f"see {self.log_file}"
        )

    def stop(self) -> bool:
        # Controlled shutdown of one node normally takes a few seconds.
        return self.process.stop(timeout_s=30.0)


class KafkaCluster:
    """Every node of the local stack's Kafka: `kafka.brokers` of them (one: the single
    broker, started and stopped exactly as `Broker` does)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.kafka = settings.kafka
        # External brokers are not ours: no node to start, stop or watch.
        self.nodes = (
            []
            if self.kafka.external
            else [Broker(settings, node.node_id) for node in cluster_nodes(self.kafka)]
        )

    def running(self) -> list[Broker]:
        return [node for node in self.nodes if node.running() is not None]

    def start(self) -> list[str]:
        """Start every node that is not running and return once all answer (and, for a
        cluster, once every node is registered with the controller, so topics of
        `replication_factor` replicas can be created). Returns the names started."""
        stopped = [node for node in self.nodes if node.running() is None]
        if len(self.nodes) == 1:
            for node in stopped:
                node.start()
            return [node.name for node in stopped]
        for node in stopped:
            node.check_ports()
        if stopped:
            # Made once before the nodes format at the same time: each must read the same id.
            stopped[0].cluster_id()
        _each_at_once(stopped, Broker.prepare)  # each format is a JVM of its own
        launched: list[Broker] = []
        try:
            for node in stopped:
                node.launch()
                launched.append(node)
            deadline = time.monotonic() + self.kafka.start_timeout_s
            for node in stopped:
                node.wait_ready(max(1.0, deadline - time.monotonic()))
            self.wait_registered(max(1.0, deadline - time.monotonic()))
        except BrokerError:
            _stop_all(launched, timeout_s=10.0)
            raise
        return [node.name for node in stopped]

    def wait_registered(self, timeout_s: float) -> None:
        """Until the cluster's metadata lists every node (a freshly started node answers
        before the others learn of it)."""
        wanted = {node.node.node_id for node in self.nodes}
        deadline = time.monotonic() + timeout_s
        seen: set[int] = set()
        while time.monotonic() < deadline:
            with contextlib.suppress(KafkaError):
                seen = live_brokers(self.kafka)
                if wanted <= seen:
                    return
            time.sleep(0.2)
        raise BrokerError(
            f"the cluster lists brokers {sorted(seen)} after {timeout_s:.0f}s, not "
            f"{sorted(wanted)}; see {', '.join(str(node.log_file) for node in self.nodes)}"
        )

    def restart(self) -> list[str]:
        """One node after the other: each is stopped, started, and every partition has all
        its replicas in sync again before the next stops, so a cluster keeps serving
        throughout (a single broker cannot): stopping the next one earlier would leave the
        partitions the restarted node still catches up on below min ISR."""
        for node in self.nodes:
            node.stop()
            node.start()
            if len(self.nodes) > 1:
                self.wait_registered(self.kafka.start_timeout_s)
                wait_in_sync(self.kafka, self.kafka.start_timeout_s)
        return [node.name for node in self.nodes]

    def stop(self, timeout_s: float = 30.0) -> list[str]:
        """Stop every running node (SIGTERM, SIGKILL after `timeout_s`); returns the names
        stopped."""
        return _stop_all(self.nodes, timeout_s=timeout_s)


def _each_at_once(nodes: list[Broker], action: Callable[[Broker], object]) -> None:
    """`action` on every node, each in a thread; raises the first error once all ended."""
    errors: list[ProcessError | JarError | OSError] = []

    def run(node: Broker) -> None:
        try:
            action(node)
        except (ProcessError, JarError, OSError) as error:  # raised below, in the caller
            errors.append(error)

    threads = [threading.Thread(target=run, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _stop_all(nodes: list[Broker], timeout_s: float) -> list[str]:
    """Stop the nodes at the same time: one after the other, the last ones would wait for a
    controller quorum that has already gone before their controlled shutdown gives up."""
    stopped: list[str] = []

    def stop(node: Broker) -> None:
        if node.process.stop(timeout_s=timeout_s):
            stopped.append(node.name)

    _each_at_once(nodes, stop)
    return sorted(stopped)


def under_replicated(described: list[dict[str, Any]]) -> list[str]:
    """ "topic[partition]" of each partition in `describe_topics` output with fewer replicas
    in sync than it has, or with no leader."""
    lagging = []
    for topic in described:
        for partition in topic["partitions"]:
            in_sync, replicas = len(partition["isr_nodes"]), len(partition["replica_nodes"])
            if partition["leader_id"] < 0 or in_sync < replicas:
                lagging.append(f"{topic['name']}[{partition['partition_index']}]")
    return sorted(lagging)


def wait_in_sync(kafka: KafkaSettings, timeout_s: float) -> float:
    """Until every partition of every topic has all its replicas in sync (a node that was
    down has caught up); returns the seconds waited."""
    started = time.monotonic()
    lagging = ["(no answer yet)"]
    while time.monotonic() - started < timeout_s:
        with contextlib.suppress(KafkaError):
            admin = KafkaAdminClient(
                bootstrap_servers=kafka.bootstrap, request_timeout_ms=5000, client_id="dispatch-isr"
            )
            try:
                lagging = under_replicated(admin.describe_topics())
            finally:
                admin.close()
            if not lagging:
                return time.monotonic() - started
        time.sleep(0.2)
    raise BrokerError(f"out of sync after {timeout_s:.0f}s: {', '.join(lagging[:10])}")


def live_brokers(kafka: KafkaSettings) -> set[int]:
    """The ids of the brokers the cluster's metadata lists (the registered, unfenced ones)."""
    admin = KafkaAdminClient(
        bootstrap_servers=kafka.bootstrap, request_timeout_ms=5000, client_id="dispatch-brokers"
    )
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    return {int(broker["broker_id"]) for broker in cluster["brokers"]}


TOPIC_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Per-topic record limit: an events record batches a whole transaction, and one submission
may carry a payload of `api.max_payload_bytes` (the broker's default is 1 MiB)."""


def create_topics(kafka: KafkaSettings, topics: dict[str, int] | None = None) -> list[str]:
    """Create the dispatcher's topics (or the given ones) if missing, with
    `kafka.replication_factor` replicas and `kafka.min_insync_replicas`; returns those
    created. Existing topics are left as they are (a warning names any with fewer replicas
    than configured)."""
    wanted = topics if topics is not None else kafka.topics
    configs = {
        "retention.ms": str(kafka.retention_hours * 3600 * 1000),
        "min.insync.replicas": str(kafka.min_insync_replicas),
        "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES),
    }
    replicas = kafka.replication_factor
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap, client_id="dispatch-topics")
    try:
        existing = set(admin.list_topics())
        missing = {
            name: {"num_partitions": partitions, "replication_factor": replicas, "configs": configs}
            for name, partitions in wanted.items()
            if name not in existing
        }
        _warn_under_replicated(admin, sorted(set(wanted) & existing), replicas)
        if missing and replicas > 1:
            # Kafka's own refusal (INVALID_REPLICATION_FACTOR) does not say what to change.
            brokers = len(admin.describe_cluster()["brokers"])
            if brokers < replicas:
                raise BrokerError(
                    f"{kafka.bootstrap} has {brokers} live broker(s), fewer than "
                    f"kafka.replication_factor ({replicas}): start the missing ones, or lower "
                    "kafka.replication_factor / kafka.brokers"
                )
        if missing:
            # Another process may create the same topic between our list and our create.
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(missing, timeout_ms=30_000, wait_for_metadata=True)
        return sorted(missing)
    finally:
        admin.close()


def _warn_under_replicated(admin: KafkaAdminClient, names: list[str], replicas: int) -> None:
    if not names or replicas == 1:
        return
    for topic in admin.describe_topics(names):
        have = min((len(p["replica_nodes"]) for p in topic["partitions"]), default=replicas)
        if have < replicas:
            log.warning(
                "topic %s exists with %d replica(s), kafka.replication_factor is %d: it was "
                "made before; reassign its partitions to replicate it",
                topic["name"], have, replicas,
            )  # fmt: skip

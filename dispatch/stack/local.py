"""The embedded local stack as one unit: what `dispatch up`, `down` and `status` act on.

In start order (stopped in reverse): the object store (S3Proxy, when `storage.serve`), the
Kafka broker (or `kafka.brokers` nodes of a local cluster; none with `kafka.external`) and its
topics, a Spark standalone master and workers (when `spark.cluster_workers`), the Structured
Streaming fold (`dispatch streaming`), one API node per `api.ports` (the first to take the
lease leads, the others stand by), and optionally demo workers (`dispatch.worker.examples`). Each is
a managed process with a pid file under `var/run`; `var/run/stack.json` (`dispatch.stack.plan`)
remembers which optional parts `up` started and the profile, so `status` and `down` know what
to expect. `restart` stops one component by its recorded pid and starts it again with the same
settings (`dispatch restart`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from dispatch.settings import Settings, to_environment
from dispatch.stack.broker import Broker, KafkaCluster, create_topics
from dispatch.stack.object_store import ObjectStore
from dispatch.stack.plan import StackPlan, plan_path, read_plan, write_plan
from dispatch.stack.process import ManagedProcess, ProcessError
from dispatch.stack.spark_cluster import SparkCluster

DISPATCH = str(Path(sys.executable).parent / "dispatch")
NODE_READY_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    address: str
    log_file: Path

    @property
    def running(self) -> bool:
        return self.pid is not None


class ApiNode:
    """`dispatch serve` on one port, as a managed process."""

    def __init__(self, settings: Settings, port: int) -> None:
        self.settings = settings
        self.port = port
        self.url = f"http://{settings.api.host}:{port}"
        run_dir = settings.paths.var / "run"
        self.process = ManagedProcess(
            f"api-{port}", run_dir, settings.paths.var / "logs" / f"api-{port}.log"
        )

    def start(self) -> None:
        # The child gets exactly these settings, whatever its environment or working folder.
        environment = {**os.environ, **to_environment(self.settings)}
        self.process.start([DISPATCH, "serve", "--port", str(self.port)], env=environment)

    def answers(self, path: str = "/healthz") -> bool:
        with contextlib.suppress(httpx.TransportError):
            return httpx.get(f"{self.url}{path}", timeout=2).status_code == 200
        return False


class LocalStack:
    def __init__(self, settings: Settings, plan: StackPlan | None = None) -> None:
        self.settings = settings
        self.kafka = KafkaCluster(settings)
        # Parts a profile may have the stack run (conf/profiles/cluster.toml); None: the
        # user's own (an S3 endpoint, a Spark master) or not used at all.
        self.object_store = ObjectStore(settings) if settings.storage.serve else None
        self.spark_cluster = SparkCluster(settings) if settings.spark.cluster_workers else None
        self.nodes = [ApiNode(settings, port) for port in settings.api.ports]
        self.run_dir = settings.paths.var / "run"
        self.logs = settings.paths.var / "logs"
        self.plan_file = plan_path(settings)
        self.plan = plan if plan is not None else self._saved_plan()
        self.streaming = ManagedProcess("streaming", self.run_dir, self.logs / "streaming.log")

    @property
    def broker(self) -> Broker:
        """The single broker (the first node of a cluster), for callers that kill or restart
        one broker (dispatch.bench.restart_bench, dispatch.bench.chaos)."""
        if not self.kafka.nodes:
            raise ProcessError("the brokers are external (kafka.external): none is ours")
        return self.kafka.nodes[0]

    def _saved_plan(self) -> StackPlan:
        return read_plan(self.plan_file) or StackPlan()

    def workers(self, count: int | None = None) -> list[ManagedProcess]:
        wanted = self.plan.workers if count is None else count
        return [
            ManagedProcess(f"worker-{n}", self.run_dir, self.logs / f"worker-{n}.log")
            for n in range(1, wanted + 1)
        ]

    def up(self) -> list[str]:
        """Start every component that is not running; returns the topics it had to create."""
        from dispatch.auth import ensure_dev_keys  # the API package is heavier than the stack's

        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_plan(self.plan_file, self.plan)
        if self.object_store is not None:
            self.object_store.start()  # first: the lease table and the warehouse live there
        if not self.settings.kafka.external:
            self.kafka.start()
        if self.spark_cluster is not None:
            self.spark_cluster.start()  # before the fold, which submits to its master
        # External brokers too: the topics this stack needs are its own to create.
        created = create_topics(self.settings.kafka)
        dev_keys = ensure_dev_keys(self.settings.auth)
        environment = self._environment()
        if self.plan.streaming and self.streaming.record() is None:
            self.streaming.start([DISPATCH, "streaming"], env=environment)
        for node in self.nodes:
            if node.process.record() is None:
                node.start()
        self._wait_for_leader()
        for worker in self.workers():
            if worker.record() is None:
                self._start_worker(worker, dev_keys["worker"])
        return created

    def _environment(self) -> dict[str, str]:
        # The child gets exactly these settings, whatever its environment or working folder.
        return {**os.environ, **to_environment(self.settings)}

    def _start_worker(self, worker: ManagedProcess, key: str) -> None:
        urls = ",".join(node.url for node in self.nodes)
        environment = {**self._environment(), "DISPATCH_URL": urls, "DISPATCH_API_KEY": key}
        worker.start([DISPATCH, "worker", "--app", "dispatch.worker.examples:app"], env=environment)

    def restart(self, component: str, port: int | None = None) -> list[str]:
        """Stop one component by the pid its pid file records and start it again with these
        settings: "broker" (returns once it answers), "streaming", "node" (the one on `port`;
        returns once it answers /healthz) or "workers" (every demo worker `up` started).
        The others keep running: clients and workers ride it out as they do a crash. Returns
        the names restarted."""
        if component == "broker":
            if self.settings.kafka.external:
                raise ProcessError("the brokers are external (kafka.external): not ours to restart")
            return self.kafka.restart()
        if component == "streaming":
            self.streaming.stop(timeout_s=60.0)
            self.streaming.start([DISPATCH, "streaming"], env=self._environment())
            return ["streaming"]
        if component == "node":
            node = next((node for node in self.nodes if node.port == port), None)
            if node is None:
                ports = ", ".join(str(node.port) for node in self.nodes)
                raise ProcessError(f"no API node on port {port}; the stack's ports: {ports}")
            node.process.stop(timeout_s=20.0)
            node.start()
            self._wait_answering(node)
            return [node.process.name]
        if component == "workers":
            from dispatch.auth import ensure_dev_keys

            key = ensure_dev_keys(self.settings.auth)["worker"]
            workers = self.workers()
            for worker in workers:
                worker.stop(20.0)
                self._start_worker(worker, key)
            return [worker.name for worker in workers]
        raise ProcessError(
            f"unknown component {component!r}: expected broker, streaming, node or workers"
        )

    def _wait_answering(self, node: ApiNode) -> None:
        deadline = time.monotonic() + NODE_READY_TIMEOUT_S
        while not node.answers("/healthz"):
            if node.process.record() is None:
                raise ProcessError(
                    f"the API node on port {node.port} exited during start; see "
                    f"{node.process.log_file}:\n{node.process.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ProcessError(f"the API node on port {node.port} did not answer in time")
            time.sleep(0.2)

    def _wait_for_leader(self) -> None:
        """Until one node is the ready leader (a standby answers /readyz 503)."""
        deadline = time.monotonic() + NODE_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.process.record() is None:
                    raise ProcessError(
                        f"the API node on port {node.port} exited during start; see "
                        f"{node.process.log_file}:\n{node.process.log_tail()}"
                    )
            if any(node.answers("/readyz") for node in self.nodes):
                return
            time.sleep(0.2)
        logs = ", ".join(str(node.process.log_file) for node in self.nodes)
        raise ProcessError(f"no API node became the ready leader in time; see {logs}")

    def down(self) -> list[str]:
        """Stop every running component, last started first; returns the names stopped."""
        stopped = [worker.name for worker in self.workers(_MAX_WORKERS) if worker.stop(20.0)]
        stopped += [
            node.process.name for node in reversed(self.nodes) if node.process.stop(timeout_s=20.0)
        ]
        if self.streaming.stop(timeout_s=60.0):
            stopped.append("streaming")
        if self.spark_cluster is not None:
            stopped += self.spark_cluster.stop()
        if not self.settings.kafka.external:
            stopped += self.kafka.stop()
        if self.object_store is not None and self.object_store.stop():
            stopped.append(self.object_store.name)
        # Nothing of this stack runs any more: a later `up` starts from its own options (and
        # profile), not from this one's.
        self.plan_file.unlink(missing_ok=True)
        return stopped

    def status(self) -> list[ComponentStatus]:
        components = []
        if self.object_store is not None:
            store = self.object_store
            components.append(ComponentStatus(store.name, store.pid, store.address, store.log_file))
        # External brokers are not this stack's processes: no pid to show or to watch.
        if not self.settings.kafka.external:
            for broker in self.kafka.nodes:
                record = broker.running()
                components.append(
                    ComponentStatus(
                        broker.name,
                        record.pid if record else None,
                        broker.node.listener,
                        broker.log_file,
                    )
                )
        if self.spark_cluster is not None:
            components += [
                ComponentStatus(daemon.name, daemon.pid, daemon.address, daemon.log_file)
                for daemon in self.spark_cluster.status()
            ]
        managed: list[tuple[ManagedProcess, str]] = []
        if self.plan.streaming:
            managed.append((self.streaming, str(self.settings.paths.warehouse)))
        managed += [(node.process, node.url) for node in self.nodes]
        managed += [(worker, "dispatch.worker.examples:app") for worker in self.workers()]
        for process, address in managed:
            process_record = process.record()
            components.append(
                ComponentStatus(
                    process.name,
                    process_record.pid if process_record else None,
                    address,
                    process.log_file,
                )
            )
        return components

    def wait_until_stopped(self, signals: StopSignals, poll_s: float = 1.0) -> str:
        """Block until a stop signal or until a component dies; returns why it returned."""
        while not signals.received.wait(poll_s):
            for component in self.status():
                if not component.running:
                    return f"{component.name} stopped unexpectedly; see {component.log_file}"
        return signals.name


_MAX_WORKERS = 64
"""`down` looks for this many worker pid files (`up --workers` allows no more)."""


class StopSignals:
    """SIGINT and SIGTERM set `received` instead of raising, while inside the `with`.

    Installed before `dispatch up` starts anything, so a Ctrl-C at any moment (even during
    start) ends in an orderly stop of what was started, never in a half-stopped stack."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.name = ""
        self._previous: dict[signal.Signals, Any] = {}

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.name = signal.Signals(signum).name
        self.received.set()

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

"""A Spark standalone cluster of the local stack: a master at `spark.master` and
`spark.cluster_workers` workers on loopback, started from pyspark's own launcher
(`bin/spark-class` ships in the pyspark wheel: no Spark install is needed).

Each daemon is a managed process (`var/run/spark-master.pid`, `spark-worker-N.pid`, logs in
`var/logs`), so `dispatch down` stops it from another shell. The web UIs (their `/json/`
state) listen on ports free when the daemon started; no state file records them: the pid
file keeps the daemon's argv, whose `--webui-port` is the truth for as long as it runs.
Scratch space (conf, worker dirs, executors' local dirs) lives in `var/spark-cluster`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from dispatch.settings import Settings
from dispatch.stack import class_sharing
from dispatch.stack.ports import free_port
from dispatch.stack.process import ManagedProcess, ProcessError

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
HOST = "127.0.0.1"
START_TIMEOUT_S = 120.0
"""Three cold JVMs on a busy two-core machine take 20-60 s to register."""
STOP_TIMEOUT_S = 20.0
MAX_WORKERS = 8
"""`stop` looks for this many worker pid files (SparkSettings.cluster_workers allows no more)."""


class SparkClusterError(ProcessError):
    """The cluster did not come up or answer; the message holds the daemons' log tails."""


def spark_home() -> Path:
    """pyspark's package folder, which is a SPARK_HOME (found without importing pyspark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkClusterError("pyspark is not installed in this interpreter")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


@dataclass(frozen=True)
class DaemonStatus:
    """One daemon for `dispatch status` (the fields of local.ComponentStatus)."""

    name: str
    pid: int | None
    address: str
    log_file: Path


class SparkCluster:
    """The master and workers one settings object describes (`spark.cluster_workers` > 0)."""

    def __init__(self, settings: Settings) -> None:
        spark = settings.spark
        if spark.cluster_workers < 1:
            raise SparkClusterError("spark.cluster_workers is 0: the stack runs no cluster")
        self.settings = settings
        self.spark_class = spark_home() / "bin" / "spark-class"
        # Validated by SparkSettings: spark://<loopback>:<port>.
        self.host, _, port = spark.master.removeprefix("spark://").rpartition(":")
        self.port = int(port)
        self.home = settings.paths.var / "spark-cluster"
        self.run_dir = settings.paths.var / "run"
        self.logs = settings.paths.var / "logs"
        self.master = ManagedProcess("spark-master", self.run_dir, self.logs / "spark-master.log")
        self.workers = [self._worker(n) for n in range(1, spark.cluster_workers + 1)]

    def _worker(self, number: int) -> ManagedProcess:
        name = f"spark-worker-{number}"
        return ManagedProcess(name, self.run_dir, self.logs / f"{name}.log")

    @property
    def master_url(self) -> str:
        """`spark://host:port`, what applications set as `spark.master`."""
        return self.settings.spark.master

    @property
    def processes(self) -> list[ManagedProcess]:
        return [self.master, *self.workers]

    def environment(self) -> dict[str, str]:
        """What spark-class, the daemons and the executors they fork run with."""
        # A developer's SPARK_HOME, SPARK_CONF_DIR, SPARK_WORKER_OPTS... would change what the
        # settings describe: only the settings (and this project's Spark) count.
        inherited = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("SPARK_", "PYSPARK_"))
        }
        return {
            **inherited,
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(self.home / "conf"),
            # RPC and web UIs on loopback (the UIs bind 0.0.0.0 without it).
            "SPARK_LOCAL_IP": HOST,
            # Executors' scratch space (fetched jars, shuffle files) under var, not /tmp.
            "SPARK_LOCAL_DIRS": str(self.home / "local"),
            # The daemons only do bookkeeping (Spark's default heap is 1g each).
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": " ".join(class_sharing.quick_start_options(self.settings)),
            # Executors inherit it: their Python workers run this project's interpreter even
            # for an application that does not set spark.pyspark.python.
            "PYSPARK_PYTHON": sys.executable,
        }

    def master_argv(self, ui_port: int) -> list[str]:
        return [
            str(self.spark_class), MASTER_CLASS,
            "--host", self.host, "--port", str(self.port), "--webui-port", str(ui_port),
        ]  # fmt: skip

    def worker_argv(self, number: int, ui_port: int) -> list[str]:
        spark = self.settings.spark
        return [
            str(self.spark_class), WORKER_CLASS, self.master_url,
            "--host", HOST, "--webui-port", str(ui_port),
            "--cores", str(spark.worker_cores), "--memory", spark.worker_memory,
            "--work-dir", str(self.home / f"worker-{number}"),
        ]  # fmt: skip

    def _prepare(self) -> None:
        if not self.spark_class.is_file():
            raise SparkClusterError(f"{self.spark_class} is missing: is pyspark from its wheel?")
        conf = self.home / "conf"
        work_dirs = [self.home / f"worker-{n}" for n in range(1, len(self.workers) + 1)]
        for folder in (conf, self.home / "local", *work_dirs):
            folder.mkdir(parents=True, exist_ok=True)
        # Both daemons read spark-defaults.conf from SPARK_CONF_DIR. The REST submission
        # server would take the fixed port 6066 (a second stack's would collide); applications
        # register over the master's RPC port. Finished applications' work dirs (executor
        # logs, a copy of every jar) are removed after a day, or a long-lived stack fills var.
        (conf / "spark-defaults.conf").write_text(
            "spark.master.rest.enabled false\n"
            "spark.worker.cleanup.enabled true\n"
            "spark.worker.cleanup.appDataTtl 86400\n"
        )

    def start(self, timeout_s: float = START_TIMEOUT_S) -> list[str]:
        """Start the daemons that are not running and return once the master lists every
        worker ALIVE; returns the names started. On failure, stops what it started."""
        self._prepare()
        environment = self.environment()
        started: list[ManagedProcess] = []
        try:
            if self.master.record() is None:
                if _port_taken(self.host, self.port):
                    raise SparkClusterError(
                        f"port {self.port} on {self.host} is taken by another process: stop "
                        "it or change spark.master"
                    )
                started.append(self.master)
                self.master.start(self.master_argv(free_port()), env=environment)
            for number, worker in enumerate(self.workers, start=1):
                if worker.record() is None:
                    started.append(worker)
                    worker.start(self.worker_argv(number, free_port()), env=environment)
            self._wait_for_workers(timeout_s)
        except (ProcessError, OSError):
            for process in reversed(started):
                _stop(process)
            raise
        return [process.name for process in started]

    def stop(self) -> list[str]:
        """Stop the workers, then the master; returns the names stopped. Workers beyond
        `cluster_workers` (left by a stack started with more) are stopped too."""
        extra = [self._worker(n) for n in range(len(self.workers) + 1, MAX_WORKERS + 1)]
        return [process.name for process in (*self.workers, *extra, self.master) if _stop(process)]

    def _wait_for_workers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        alive = 0
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.record() is None:
                    code = process.exit_code()
                    raise SparkClusterError(
                        f"{process.name} exited (code {code}) during start\n{self.log_tails()}"
                    )
            with contextlib.suppress(httpx.HTTPError):  # the master's UI is not up yet
                alive = self.alive_workers()
                if alive == len(self.workers):
                    return
            time.sleep(0.5)
        raise SparkClusterError(
            f"{alive} of {len(self.workers)} workers ALIVE after {timeout_s:.0f} s\n"
            f"{self.log_tails()}"
        )

    @property
    def master_ui(self) -> str | None:
        """The running master's web UI, or None."""
        return _ui_of(self.master)

    def worker_uis(self) -> list[str | None]:
        """Each configured worker's web UI (None: not running), in worker order."""
        return [_ui_of(worker) for worker in self.workers]

    def master_state(self) -> dict[str, Any]:
        """The master's JSON (`/json/`): workers, active and completed applications."""
        if (ui := self.master_ui) is None:
            raise SparkClusterError(f"the spark master is not running; see {self.master.log_file}")
        return _get_json(ui)

    def worker_states(self) -> list[dict[str, Any]]:
        """Each running worker's JSON (`/json/`): its running and finished executors."""
        return [_get_json(ui) for ui in self.worker_uis() if ui is not None]

    def alive_workers(self) -> int:
        """How many of this cluster's running workers the master lists ALIVE (matched by web
        UI: a worker restarted leaves its previous registration behind until it times out)."""
        ours = {ui for ui in self.worker_uis() if ui is not None}
        workers = self.master_state().get("workers", [])
        return sum(
            1 for w in workers if w.get("state") == "ALIVE" and w.get("webuiaddress") in ours
        )

    def status(self) -> list[DaemonStatus]:
        """The master (its URL and UI) and each worker (its UI), running or not."""
        uis = [self.master_ui, *self.worker_uis()]
        statuses = []
        for process, ui in zip(self.processes, uis, strict=True):
            address = self.master_url if process is self.master else "-"
            if ui is not None:
                address = f"{self.master_url} ui {ui}" if process is self.master else ui
            record = process.record()
            pid = record.pid if record else None
            statuses.append(DaemonStatus(process.name, pid, address, process.log_file))
        return statuses

    def log_tails(self, lines: int = 15) -> str:
        return "\n".join(
            f"--- {process.name} ({process.log_file})\n{process.log_tail(lines)}"
            for process in self.processes
        )


def on_loopback(
    settings: Settings, *, workers: int, worker_cores: int = 1, worker_memory: str = "1g"
) -> Settings:
    """`settings` with a cluster of its own: a master on a free loopback port and `workers`
    workers of `worker_cores` cores and `worker_memory` each (a test's, a benchmark's)."""
    spark = settings.spark.model_copy(
        update={
            "master": f"spark://{HOST}:{free_port()}",
            "cluster_workers": workers,
            "worker_cores": worker_cores,
            "worker_memory": worker_memory,
        }
    )
    return settings.model_copy(update={"spark": spark})


_Cluster = TypeVar("_Cluster", bound=SparkCluster)


@contextlib.contextmanager
def running(cluster: _Cluster, timeout_s: float = START_TIMEOUT_S) -> Iterator[_Cluster]:
    """`cluster` started (every worker ALIVE), and stopped by its pids on the way out, whatever
    the body did (`start` stops what it started if it fails)."""
    try:
        cluster.start(timeout_s=timeout_s)
        yield cluster
    finally:
        cluster.stop()


def _stop(process: ManagedProcess) -> bool:
    record = process.record()
    stopped = process.stop(timeout_s=STOP_TIMEOUT_S)
    if record is not None:
        # A worker's executor JVMs (and their Python workers) are in its process group (its
        # own session, see ManagedProcess.start): none may outlive it. Its shutdown hook kills
        # them normally; SIGKILL catches what a killed or hung worker left behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)
    return stopped


def _ui_of(process: ManagedProcess) -> str | None:
    record = process.record()
    if record is None or "--webui-port" not in record.argv:
        return None
    return f"http://{HOST}:{record.argv[record.argv.index('--webui-port') + 1]}"


def _get_json(ui: str) -> dict[str, Any]:
    answer = httpx.get(f"{ui}/json/", timeout=5)
    answer.raise_for_status()
    document: dict[str, Any] = answer.json()
    return document


def _port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, port)) == 0

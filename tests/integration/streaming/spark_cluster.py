"""A Spark standalone cluster on loopback for tests: one master and N workers, started from
pyspark's own launcher (`bin/spark-class` ships in the pyspark wheel, no Spark install needed).

Each daemon is a subprocess in a session of its own, tracked by a pid file
(`dispatch.stack.process.ManagedProcess`) and stopped by that pid: SIGTERM, then SIGKILL to
its process group (a worker's executor JVMs are in it) after a timeout. `spark_cluster()`
stops them in a `finally`, whatever the test did.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pyspark

from dispatch.stack.ports import free_port
from dispatch.stack.process import ManagedProcess

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
HOST = "127.0.0.1"


class ClusterError(Exception):
    """The cluster did not come up; the message holds the daemons' log tails."""


@dataclass
class SparkCluster:
    master_url: str
    """`spark://127.0.0.1:<port>`, for `spark.master`."""
    master_ui: str
    worker_uis: list[str]
    processes: list[ManagedProcess] = field(default_factory=list)

    def master_state(self) -> dict[str, Any]:
        """The master's JSON (`/json/`): workers, active and completed applications."""
        return _get_json(self.master_ui)

    def worker_states(self) -> list[dict[str, Any]]:
        """Each worker's JSON (`/json/`): its running and finished executors."""
        return [_get_json(ui) for ui in self.worker_uis]

    def alive_workers(self) -> int:
        workers = self.master_state().get("workers", [])
        return sum(1 for worker in workers if worker.get("state") == "ALIVE")

    def executors_by_worker(self, app_id: str) -> list[list[dict[str, Any]]]:
        """Per worker, the executors it runs (or ran) for `app_id`."""
        return [
            [
                executor
                for executor in state.get("executors", []) + state.get("finishedexecutors", [])
                if executor.get("appid") == app_id
            ]
            for state in self.worker_states()
        ]

    def log_tails(self, lines: int = 15) -> str:
        return "\n".join(
            f"--- {process.name} ({process.log_file})\n{process.log_tail(lines)}"
            for process in self.processes
        )


def _get_json(ui: str) -> dict[str, Any]:
    answer = httpx.get(f"{ui}/json/", timeout=5)
    answer.raise_for_status()
    document: dict[str, Any] = answer.json()
    return document


def daemon_environment(base: Path) -> dict[str, str]:
    """What spark-class needs: SPARK_HOME (the pyspark package), loopback, a conf folder of
    its own (so a developer's spark-env.sh or SPARK_CONF_DIR does not leak in), small heaps."""
    conf = base / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    # The master's REST submission server would take the fixed port 6066 (and collide with a
    # developer's cluster); applications here register over the master's RPC port instead.
    (conf / "spark-defaults.conf").write_text("spark.master.rest.enabled false\n")
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": HOST,
        # Executors' scratch space (fetched jars, shuffle files) under the test's folder, not
        # /tmp/spark-*: nothing is left behind even when a JVM is killed.
        "SPARK_LOCAL_DIRS": str(base / "local"),
        # The master and worker daemons do bookkeeping only (Spark's default is 1g each).
        "SPARK_DAEMON_MEMORY": "256m",
    }


@contextmanager
def spark_cluster(
    base: Path,
    *,
    workers: int = 2,
    worker_memory: str = "1g",
    start_timeout_s: float = 90.0,
) -> Iterator[SparkCluster]:
    """A master and `workers` workers (1 core, `worker_memory` each) on 127.0.0.1, yielded
    once the master lists them all ALIVE; all stopped by pid on the way out."""
    if not SPARK_CLASS.is_file():
        raise ClusterError(f"{SPARK_CLASS} is missing: is pyspark installed from its wheel?")
    environment = daemon_environment(base)
    logs, run_dir = base / "logs", base / "run"
    master_port, master_ui_port = free_port(), free_port()
    worker_ui_ports = [free_port() for _ in range(workers)]
    cluster = SparkCluster(
        master_url=f"spark://{HOST}:{master_port}",
        master_ui=f"http://{HOST}:{master_ui_port}",
        worker_uis=[f"http://{HOST}:{port}" for port in worker_ui_ports],
    )
    with ExitStack() as stops:
        master = ManagedProcess("spark-master", run_dir, logs / "spark-master.log")
        cluster.processes.append(master)
        stops.callback(master.stop, 20.0)
        master.start(
            [
                str(SPARK_CLASS),
                MASTER_CLASS,
                *_flags(host=HOST, port=master_port, webui_port=master_ui_port),
            ],
            env=environment,
        )
        for number, ui_port in enumerate(worker_ui_ports, start=1):
            work_dir = base / f"worker-{number}"
            work_dir.mkdir(parents=True, exist_ok=True)
            worker = ManagedProcess(
                f"spark-worker-{number}", run_dir, logs / f"spark-worker-{number}.log"
            )
            cluster.processes.append(worker)
            stops.callback(worker.stop, 20.0)
            flags = _flags(
                host=HOST, cores=1, memory=worker_memory, webui_port=ui_port, work_dir=work_dir
            )
            worker.start(
                [str(SPARK_CLASS), WORKER_CLASS, cluster.master_url, *flags], env=environment
            )
        _wait_for_workers(cluster, workers, start_timeout_s)
        yield cluster


def _flags(**options: object) -> list[str]:
    """`--name value` pairs (underscores become dashes), as the daemons' command lines take."""
    return [
        part
        for name, value in options.items()
        for part in (f"--{name.replace('_', '-')}", str(value))
    ]


def _wait_for_workers(cluster: SparkCluster, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    alive = 0
    while time.monotonic() < deadline:
        for process in cluster.processes:
            if process.exit_code() is not None:
                raise ClusterError(f"{process.name} exited\n{cluster.log_tails()}")
        try:
            alive = cluster.alive_workers()
        except httpx.HTTPError:
            alive = 0  # the master's web UI is not up yet
        if alive >= count:
            return
        time.sleep(0.5)
    raise ClusterError(
        f"{alive} of {count} workers ALIVE after {timeout_s:.0f} s\n{cluster.log_tails()}"
    )

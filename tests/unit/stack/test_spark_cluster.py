"""The stack's Spark standalone cluster: its commands and environment from the settings, its
state read back from pid files (stand-in processes, no JVM), and one real master and worker
started, found running by a second `start`, and stopped by pid."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from dispatch.settings import Settings, load_settings
from dispatch.stack.ports import free_port
from dispatch.stack.process import ManagedProcess, is_running
from dispatch.stack.spark_cluster import (
    MASTER_CLASS,
    WORKER_CLASS,
    SparkCluster,
    SparkClusterError,
    on_loopback,
    running,
    spark_home,
)
from tests.integration.leftovers import processes_mentioning


def cluster_settings(
    var: Path, port: int = 17077, workers: int = 2, host: str = "127.0.0.1", **spark: object
) -> Settings:
    return load_settings(
        paths={"var": str(var)},
        spark={"master": f"spark://{host}:{port}", "cluster_workers": workers, **spark},
    )


def stand_in(process: ManagedProcess, ui_port: int) -> None:
    """A sleeping Python whose recorded argv carries a daemon's `--webui-port`."""
    code = "import time; time.sleep(60)"
    process.start([sys.executable, "-c", code, "--webui-port", str(ui_port)])


def test_a_stack_without_cluster_workers_has_no_cluster(tmp_path: Path) -> None:
    settings = load_settings(paths={"var": str(tmp_path)}, spark={"master": "local[2]"})
    with pytest.raises(SparkClusterError, match="cluster_workers is 0"):
        SparkCluster(settings)


def test_the_daemons_commands_come_from_the_settings(tmp_path: Path) -> None:
    settings = cluster_settings(tmp_path, worker_cores=2, worker_memory="768m")
    cluster = SparkCluster(settings)
    spark_class = str(spark_home() / "bin" / "spark-class")
    assert cluster.master_url == "spark://127.0.0.1:17077"
    assert cluster.master_argv(18080) == [
        spark_class, MASTER_CLASS,
        "--host", "127.0.0.1", "--port", "17077", "--webui-port", "18080",
    ]  # fmt: skip
    assert cluster.worker_argv(2, 18082) == [
        spark_class, WORKER_CLASS, "spark://127.0.0.1:17077",
        "--host", "127.0.0.1", "--webui-port", "18082", "--cores", "2", "--memory", "768m",
        "--work-dir", str(tmp_path / "spark-cluster" / "worker-2"),
    ]  # fmt: skip
    assert [process.name for process in cluster.processes] == [
        "spark-master", "spark-worker-1", "spark-worker-2",
    ]  # fmt: skip
    assert cluster.master.pid_file == tmp_path / "run" / "spark-master.pid"
    assert cluster.workers[1].log_file == tmp_path / "logs" / "spark-worker-2.log"


def test_a_localhost_master_listens_on_localhost(tmp_path: Path) -> None:
    cluster = SparkCluster(cluster_settings(tmp_path, host="localhost", workers=1))
    assert cluster.master_argv(1)[2:6] == ["--host", "localhost", "--port", "17077"]


def test_the_environment_is_this_projects_spark_and_python_on_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A developer's own Spark must not leak into the stack's daemons.
    monkeypatch.setenv("SPARK_CONF_DIR", "/etc/spark")
    monkeypatch.setenv("SPARK_WORKER_OPTS", "-Dspark.worker.timeout=1")
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python2")
    environment = SparkCluster(cluster_settings(tmp_path)).environment()
    assert environment["SPARK_HOME"] == str(spark_home())
    assert (spark_home() / "bin" / "spark-class").is_file()
    assert environment["PYSPARK_PYTHON"] == sys.executable
    assert environment["SPARK_CONF_DIR"] == str(tmp_path / "spark-cluster" / "conf")
    assert environment["SPARK_LOCAL_DIRS"] == str(tmp_path / "spark-cluster" / "local")
    assert environment["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert "SPARK_WORKER_OPTS" not in environment
    assert environment["PATH"] == os.environ["PATH"]


def test_uis_and_status_come_from_the_running_daemons_pid_files(tmp_path: Path) -> None:
    cluster = SparkCluster(cluster_settings(tmp_path))
    assert (cluster.master_ui, cluster.worker_uis()) == (None, [None, None])
    assert [(s.name, s.pid, s.address) for s in cluster.status()] == [
        ("spark-master", None, "spark://127.0.0.1:17077"),
        ("spark-worker-1", None, "-"),
        ("spark-worker-2", None, "-"),
    ]
    with pytest.raises(SparkClusterError, match="master is not running"):
        cluster.master_state()
    stand_in(cluster.master, 18080)
    stand_in(cluster.workers[1], 18082)
    # A worker of a stack once started with more workers than the settings now say.
    leftover = ManagedProcess("spark-worker-3", cluster.run_dir, tmp_path / "w3.log")
    stand_in(leftover, 18083)
    records = [process.record() for process in (cluster.master, cluster.workers[1], leftover)]
    pids = [record.pid for record in records if record is not None]
    try:
        assert cluster.master_ui == "http://127.0.0.1:18080"
        assert cluster.worker_uis() == [None, "http://127.0.0.1:18082"]
        status = cluster.status()
        assert status[0].address == "spark://127.0.0.1:17077 ui http://127.0.0.1:18080"
        assert [s.pid for s in status] == [pids[0], None, pids[1]]
        assert status[2].address == "http://127.0.0.1:18082"
        assert status[2].log_file == tmp_path / "logs" / "spark-worker-2.log"
    finally:
        stopped = cluster.stop()
        leftover.stop()  # stopped by the cluster's own object: this one reaps its child
    # Workers first (the leftover too), the master last.
    assert stopped == ["spark-worker-2", "spark-worker-3", "spark-master"]
    assert not any(record and is_running(record.pid, record.ticks) for record in records)
    assert cluster.stop() == []


def test_a_master_port_taken_by_another_process_is_refused(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        cluster = SparkCluster(cluster_settings(tmp_path, port=port))
        with pytest.raises(SparkClusterError, match=f"port {port} on 127.0.0.1 is taken"):
            cluster.start()
    assert list((tmp_path / "run").glob("*.pid")) == []
    assert processes_mentioning(tmp_path) == []


def test_a_real_cluster_starts_once_and_stops_by_pid(tmp_path: Path) -> None:
    settings = cluster_settings(
        tmp_path, port=free_port(), workers=1, worker_cores=2, worker_memory="512m"
    )
    cluster = SparkCluster(settings)
    try:
        assert cluster.start(timeout_s=120.0) == ["spark-master", "spark-worker-1"]
        records = [process.record() for process in cluster.processes]
        [worker] = cluster.master_state()["workers"]
        assert (worker["state"], worker["cores"], worker["memory"]) == ("ALIVE", 2, 512)
        assert worker["webuiaddress"] == cluster.worker_uis()[0]
        [worker_state] = cluster.worker_states()
        assert worker_state["executors"] == []
        assert all(status.pid for status in cluster.status())
        # Idempotent: the running daemons are found by their pid files, not started again.
        assert SparkCluster(settings).start(timeout_s=30.0) == []
        assert [process.record() for process in cluster.processes] == records
    finally:
        stopped = cluster.stop()
    assert stopped == ["spark-worker-1", "spark-master"]
    assert not any(record and is_running(record.pid, record.ticks) for record in records)
    assert list((tmp_path / "run").glob("*.pid")) == []
    assert processes_mentioning(tmp_path) == []


def test_on_loopback_gives_a_cluster_of_its_own_and_running_stops_it_when_the_body_fails(
    tmp_path: Path,
) -> None:
    settings = on_loopback(
        load_settings(paths={"var": str(tmp_path)}), workers=3, worker_cores=2, worker_memory="2g"
    )
    spark = settings.spark
    assert (spark.cluster_workers, spark.worker_cores, spark.worker_memory) == (3, 2, "2g")
    assert spark.master.startswith("spark://127.0.0.1:")
    calls: list[str] = []

    class Recorded(SparkCluster):
        """The stack's cluster with its daemons left out: what `running` asks of it."""

        def start(self, timeout_s: float = 0.0) -> list[str]:
            calls.append("start")
            return []

        def stop(self) -> list[str]:
            calls.append("stop")
            return []

    with pytest.raises(RuntimeError, match="the body failed"), running(Recorded(settings)):
        raise RuntimeError("the body failed")
    assert calls == ["start", "stop"]

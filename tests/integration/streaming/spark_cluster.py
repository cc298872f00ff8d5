"""A Spark standalone cluster on loopback for tests: the local stack's own component
(`dispatch.stack.spark_cluster`, a master and N workers from pyspark's `bin/spark-class`)
with settings of the test's folder and a free master port.

Every daemon is stopped by its pid (SIGTERM, then SIGKILL to its process group, where a
worker's executor JVMs are) in a `finally`, whatever the test did.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dispatch.settings import load_settings
from dispatch.stack import spark_cluster as component
from dispatch.stack.ports import free_port

HOST = component.HOST
ClusterError = component.SparkClusterError


class SparkCluster(component.SparkCluster):
    """The stack's cluster, plus what tests ask of it."""

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


@contextmanager
def spark_cluster(
    base: Path,
    *,
    workers: int = 2,
    worker_memory: str = "1g",
    start_timeout_s: float = 90.0,
) -> Iterator[SparkCluster]:
    """A master and `workers` workers (1 core, `worker_memory` each) on 127.0.0.1, their state
    under `base`, yielded once the master lists them all ALIVE; all stopped on the way out."""
    settings = load_settings(
        paths={"var": str(base)},
        spark={
            "master": f"spark://{HOST}:{free_port()}",
            "cluster_workers": workers,
            "worker_memory": worker_memory,
            "worker_cores": 1,
        },
    )
    cluster = SparkCluster(settings)
    try:
        cluster.start(timeout_s=start_timeout_s)  # stops what it started if it fails
        yield cluster
    finally:
        cluster.stop()

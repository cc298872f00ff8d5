"""A Spark standalone cluster on loopback for tests: the local stack's own component
(`dispatch.stack.spark_cluster`, a master and N workers from pyspark's `bin/spark-class`)
with settings of the test's folder and a free master port.

Every daemon is stopped by its pid (SIGTERM, then SIGKILL to its process group, where a
worker's executor JVMs are) in a `finally`, whatever the test did.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from dispatch.settings import load_settings
from dispatch.stack import spark_cluster as component

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


def spark_cluster(
    base: Path,
    *,
    workers: int = 2,
    worker_memory: str = "1g",
    start_timeout_s: float = 90.0,
) -> AbstractContextManager[SparkCluster]:
    """A master and `workers` workers (1 core, `worker_memory` each) on 127.0.0.1, their state
    under `base`, yielded once the master lists them all ALIVE; all stopped on the way out."""
    settings = component.on_loopback(
        load_settings(paths={"var": str(base)}), workers=workers, worker_memory=worker_memory
    )
    return component.running(SparkCluster(settings), timeout_s=start_timeout_s)

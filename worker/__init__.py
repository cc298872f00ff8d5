"""The worker SDK and the `dispatch worker` process."""

from worker.jobs import Assignment, PermanentError, Retry
from worker.sdk import WorkerApp, WorkerError

__all__ = ["Assignment", "PermanentError", "Retry", "WorkerApp", "WorkerError"]

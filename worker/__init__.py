"""The worker SDK and the `dispatch worker` process."""

from dispatch.worker.jobs import Assignment, PermanentError, Retry
from dispatch.worker.sdk import WorkerApp, WorkerError

__all__ = ["Assignment", "PermanentError", "Retry", "WorkerApp", "WorkerError"]

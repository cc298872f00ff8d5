"""The worker SDK and the `dispatch worker` process."""

from dispatch.worker.jobs import Assignment, JobCancelled, PermanentError, Retry
from dispatch.worker.sdk import WorkerApp, WorkerError
from dispatch.worker.tasks import Submitted, Task

__all__ = [
    "Assignment",
    "JobCancelled",
    "PermanentError",
    "Retry",
    "Submitted",
    "Task",
    "WorkerApp",
    "WorkerError",
]

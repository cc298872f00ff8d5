"""The pure dispatcher core: events in, decisions out. Standard library only.

Two layers:
- the per-job lifecycle reducer (`fold_job`, `apply_job_event`): queued -> running ->
  succeeded | dead | cancelled, attempts, results; what the Spark fold runs per job;
- the scheduler (`Dispatcher`): exec queues served round-robin, priorities, per-client
  fairness and caps, subject routing, credits, deadlines with backoff, the dead-letter queue,
  worker loss; its commands decide events and fold them with the same reducer.

Time is an input (`now`), never read here; nothing is random; `apply(event)` folds facts
without deciding anything, so replaying the emitted events rebuilds the same state.
See docs/core.md.
"""

from dispatch.core.checks import check_invariants, state_view
from dispatch.core.codec import decode_events, encode_event, encode_events
from dispatch.core.commands import DEFAULT_CLIENT_ID, SubmitRequest
from dispatch.core.config import CoreConfig, ack_timeout
from dispatch.core.dispatcher import MAX_CREDITS, Dispatcher
from dispatch.core.errors import InvalidTransition, RejectCode, Rejected
from dispatch.core.events import (
    EVENT_TYPES,
    Assigned,
    Cancelled,
    CancelRequested,
    Completed,
    CreditGranted,
    DeadLettered,
    Enqueued,
    Event,
    Expired,
    JobEvent,
    JobHeartbeat,
    LeaderElected,
    LimitRemoved,
    LimitSet,
    Paused,
    PauseScope,
    Pruned,
    Reassigned,
    Redriven,
    Requeued,
    Resumed,
    WorkerHeartbeat,
    WorkerJoined,
    WorkerLost,
    event_from_dict,
)
from dispatch.core.fence import EpochFence, fence_events
from dispatch.core.job import (
    TERMINAL_STATUSES,
    DeadReason,
    JobRecord,
    JobStatus,
    RequeueReason,
)
from dispatch.core.limits import MAX_KEY_LENGTH, Limit, LimitScope
from dispatch.core.queries import QueueStats
from dispatch.core.reducer import apply_job_event, fold_job, fold_job_events
from dispatch.core.retry import RetryPolicy
from dispatch.core.state import DispatcherState
from dispatch.core.subjects import ASSIGN_PREFIX, assign_subject, subject_matches
from dispatch.core.workers import WorkerRecord

__all__ = [
    "ASSIGN_PREFIX",
    "DEFAULT_CLIENT_ID",
    "EVENT_TYPES",
    "MAX_CREDITS",
    "MAX_KEY_LENGTH",
    "TERMINAL_STATUSES",
    "Assigned",
    "CancelRequested",
    "Cancelled",
    "Completed",
    "CoreConfig",
    "CreditGranted",
    "DeadLettered",
    "DeadReason",
    "Dispatcher",
    "DispatcherState",
    "Enqueued",
    "EpochFence",
    "Event",
    "Expired",
    "InvalidTransition",
    "JobEvent",
    "JobHeartbeat",
    "JobRecord",
    "JobStatus",
    "LeaderElected",
    "Limit",
    "LimitRemoved",
    "LimitScope",
    "LimitSet",
    "PauseScope",
    "Paused",
    "Pruned",
    "QueueStats",
    "Reassigned",
    "Redriven",
    "RejectCode",
    "Rejected",
    "RequeueReason",
    "Requeued",
    "Resumed",
    "RetryPolicy",
    "SubmitRequest",
    "WorkerHeartbeat",
    "WorkerJoined",
    "WorkerLost",
    "WorkerRecord",
    "ack_timeout",
    "apply_job_event",
    "assign_subject",
    "check_invariants",
    "decode_events",
    "encode_event",
    "encode_events",
    "event_from_dict",
    "fence_events",
    "fold_job",
    "fold_job_events",
    "state_view",
    "subject_matches",
]

"""One valid instance of every event type (shared by the event and codec tests)."""

from __future__ import annotations

from dispatch.core import (
    Assigned,
    Cancelled,
    Completed,
    CreditGranted,
    DeadLettered,
    DeadReason,
    Enqueued,
    Event,
    JobHeartbeat,
    LeaderElected,
    Pruned,
    Reassigned,
    Redriven,
    Requeued,
    RequeueReason,
    WorkerHeartbeat,
    WorkerJoined,
    WorkerLost,
)

SAMPLES: list[Event] = [
    LeaderElected(epoch=3, at=10.0, holder="http://127.0.0.1:8000"),
    Pruned(epoch=3, at=10.0, before=5.0),
    WorkerJoined(epoch=3, at=10.0, worker_id="w1", subjects=("job.assign.image.*", "job.>")),
    CreditGranted(epoch=3, at=10.0, worker_id="w1", credits=4, replace=True),
    WorkerHeartbeat(epoch=3, at=10.0, worker_id="w1"),
    WorkerLost(epoch=3, at=10.0, worker_id="w1", reason="silent for 15s"),
    Enqueued(
        epoch=3,
        at=10.0,
        job_id="j1",
        client_id="acme",
        exec="image.resize",
        payload={"url": "s3://in", "sizes": [1, 2]},
        max_attempts=5,
        timeout_s=30.0,
        priority=2,
        not_before=40.0,
        seq=7,
    ),
    Assigned(epoch=3, at=10.0, job_id="j1", worker_id="w1", attempt=1, lease="3.1", deadline=40.0),
    Reassigned(
        epoch=3,
        at=41.0,
        job_id="j1",
        worker_id="w2",
        previous_worker_id="w1",
        attempt=2,
        lease="3.2",
        deadline=101.0,
    ),
    JobHeartbeat(
        epoch=3, at=50.0, job_id="j1", worker_id="w2", attempt=2, lease="3.2", deadline=111.0
    ),
    Completed(
        epoch=3, at=60.0, job_id="j1", worker_id="w2", attempt=2, lease="3.2", result=[1, "a"]
    ),
    Requeued(
        epoch=3,
        at=60.0,
        job_id="j2",
        reason=RequeueReason.FAILED,
        worker_id="w1",
        attempt=1,
        error="flaky",
        seq=-4,
    ),
    DeadLettered(
        epoch=3,
        at=60.0,
        job_id="j3",
        reason=DeadReason.PERMANENT_FAILURE,
        worker_id="w1",
        attempt=2,
        error="bad input",
    ),
    Cancelled(epoch=3, at=60.0, job_id="j4"),
    Redriven(epoch=3, at=60.0, job_id="j3", seq=8),
]

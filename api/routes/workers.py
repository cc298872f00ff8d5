"""Workers: long-poll for assignments with credits, settle them by attempt and lease.

A worker id belongs to the key that registered it (admins may act for any): a poll for
another key's worker answers 403, and every settlement names its key, so the leader refuses
one for a job held by another key's worker. A worker served by an open WebSocket is polled
only through it (409): a poll would replace its credit and subjects under the socket.
A long-poll belongs to the leadership term it started under: when that term ends, it
answers 307 to the new leader (or 503) instead of waiting on. Each answer carries the
leader's epoch; a poll that sends back another one (the worker's first poll of a new term, or
of its life) with the attempts it holds rejoins the worker (`RejoinWorker`, as a socket's
hello): an assignment the previous term committed and whose answer was lost is requeued at
once instead of waiting for its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter

from dispatch.api.deps import NodeDep, WorkerDep, owner_of
from dispatch.api.errors import ApiError
from dispatch.api.leader import LeaderUnavailable
from dispatch.api.loop_commands import (
    AckJob,
    AckMany,
    ExtendAttempt,
    FailJob,
    JobView,
    PresentWorker,
    RejoinWorker,
)
from dispatch.api.schemas import (
    Ack,
    AckBatch,
    Beat,
    Fail,
    HeartbeatAnswer,
    Poll,
    Settled,
    SettledBatch,
)
from dispatch.wire import CANCEL_REQUESTED, Assignments

router = APIRouter(prefix="/v1", tags=["workers"])


@router.post("/workers/{worker_id}/poll", response_model=Assignments)
async def poll(worker_id: str, body: Poll, node: NodeDep, principal: WorkerDep) -> Assignments:
    """Register, grant credits, and wait up to `wait_s` for assignments."""
    hub = node.hub
    assert hub is not None
    owner = owner_of(principal)
    session = hub.worker_session(worker_id)
    if session is not None:
        if owner is not None and session.owner not in (None, owner):
            raise ApiError(403, f"worker id {worker_id!r} belongs to another key")
        raise ApiError(409, f"worker {worker_id!r} is served by an open WebSocket", "conflict")
    term_ended = hub.term_ended()
    term = node.leader()
    epoch = term.core.epoch
    held = [(attempt.id, attempt.attempt, attempt.lease) for attempt in body.held or ()]
    if body.held is not None and body.epoch != epoch:
        # The worker's first poll of this term (or of its life): the leader may believe it
        # holds assignments it never received (a poll answer lost with the previous leader).
        # As a socket's hello does, make the leader's view what the worker says: what it does
        # not hold is requeued now, not when its deadline passes.
        join = RejoinWorker(hub, worker_id, body.subjects, held, body.credits, owner)
        epoch, must_stop = await node.call(join)
    else:
        present = PresentWorker(hub, worker_id, body.subjects, body.credits, owner, held)
        must_stop = await node.call(present)
    outbox = hub.outbox(worker_id)
    if not outbox.items and not outbox.stops and body.wait_s > 0 and body.credits > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(outbox.changed.wait(), timeout=body.wait_s)
    # A term that ended while we waited (even if this node leads again): 307 or 503, and
    # the worker polls the leader of now.
    if node.leader() is not term or term_ended.is_set():
        elsewhere = node.election.leader_address
        raise LeaderUnavailable(
            "the leadership term of this poll ended",
            leader=elsewhere if elsewhere != node.address else None,
        )
    # What it must stop: what its `held` says it runs that the leader ended or is cancelling
    # (answered with the poll's own command: after a failover, or a missed answer), and the
    # orders committed while it waited.
    stops = {(order["id"], order["attempt"]): order for order in must_stop}
    for order in outbox.take_stops():
        stops.setdefault((order["id"], order["attempt"]), order)
    return Assignments.model_validate(
        {
            "assignments": hub.take(worker_id, body.credits),
            "epoch": epoch,
            "cancel": list(stops.values()),
        }
    )


def _settled(job_id: str, view: JobView | None) -> JobView:
    if view is None:
        raise ApiError(404, f"no job {job_id!r}")
    return view


@router.post("/jobs/{job_id}/ack", response_model=Settled)
async def ack(job_id: str, body: Ack, node: NodeDep, principal: WorkerDep) -> Settled:
    """The attempt succeeded with `result`. A repeat of the same ack answers the same."""
    owner = owner_of(principal)
    command = AckJob(job_id, body.attempt, body.lease, body.result, body.worker_id, owner)
    job = _settled(job_id, await node.call(command))
    return Settled(id=job_id, status=job["status"])


@router.post("/jobs/{job_id}/fail", response_model=Settled)
async def fail(job_id: str, body: Fail, node: NodeDep, principal: WorkerDep) -> Settled:
    """The attempt failed: retried after its retry delay (or `retry_after_s`) if `retryable`
    and attempts remain, else dead."""
    owner = owner_of(principal)
    command = FailJob(
        job_id, body.attempt, body.lease, body.error, body.retryable, body.worker_id, owner,
        body.retry_after_s,
    )  # fmt: skip
    job = _settled(job_id, await node.call(command))
    return Settled(id=job_id, status=job["status"])


@router.post("/jobs/{job_id}/heartbeat", response_model=HeartbeatAnswer)
async def heartbeat(
    job_id: str, body: Beat, node: NodeDep, principal: WorkerDep
) -> HeartbeatAnswer:
    """Still working: the deadline moves to now + the attempt's timeout (never past its
    `max_run_s`). `cancel` set: the job was cancelled; stop, and fail the attempt to confirm."""
    owner = owner_of(principal)
    progress = None if body.progress is None else body.progress.model_dump()
    command = ExtendAttempt(job_id, body.attempt, body.lease, body.worker_id, owner, progress)
    job = _settled(job_id, await node.call(command))
    cancel = CANCEL_REQUESTED if job["cancel_requested_at"] is not None else None
    return HeartbeatAnswer(id=job_id, deadline=job["deadline"], cancel=cancel)


@router.post("/jobs:ack", response_model=SettledBatch)
async def ack_batch(body: AckBatch, node: NodeDep, principal: WorkerDep) -> SettledBatch:
    """Many acks in one request; each is answered on its own (a stale one does not stop others,
    nor does one naming another worker than the job's)."""
    acks = [
        (item.worker_id, (item.id, item.attempt, item.lease, item.result)) for item in body.acks
    ]
    outcomes = await node.call(AckMany(acks, owner_of(principal)))
    return SettledBatch(results=[Settled(**outcome.to_dict()) for outcome in outcomes])

"""Workers: long-poll for assignments with credits, settle them by attempt and lease."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import APIRouter

from api.deps import NodeDep, WorkerDep
from api.errors import ApiError
from api.hub import Hub, public_job
from api.schemas import (
    Ack,
    AckBatch,
    Assignments,
    Fail,
    HeartbeatAnswer,
    Poll,
    Settle,
    Settled,
    SettledBatch,
)
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.errors import Rejected
from dispatch.core.events import Event

router = APIRouter(prefix="/v1", tags=["workers"])


def present(
    core: Dispatcher, *, hub: Hub, worker_id: str, subjects: list[str], credits: int, now: float
) -> list[Event]:
    """A REST poll: (re)join if needed, say "I have room for `credits`", count as alive.

    Assignments already committed to this worker but not yet taken fill part of that room,
    so the grant is what is left of it."""
    events: list[Event] = []
    known = core.worker(worker_id)
    if known is None or list(known.subjects) != subjects:
        events += core.join(worker_id, subjects, now)
    room = max(0, credits - hub.undelivered(worker_id))
    events += core.grant_credit(worker_id, room, now, replace=True)
    events += core.worker_heartbeat(worker_id, now)
    return events


@router.post("/workers/{worker_id}/poll", response_model=Assignments)
async def poll(worker_id: str, body: Poll, node: NodeDep, _principal: WorkerDep) -> Assignments:
    """Register, grant credits, and wait up to `wait_s` for assignments."""
    hub = node.hub
    assert hub is not None
    await node.call(
        lambda core, now: present(
            core,
            hub=hub,
            worker_id=worker_id,
            subjects=body.subjects,
            credits=body.credits,
            now=now,
        )
    )
    outbox = hub.outbox(worker_id)
    if not outbox.items and body.wait_s > 0 and body.credits > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(outbox.changed.wait(), timeout=body.wait_s)
    node.leader()  # a leader that stopped while we waited: 503, the worker polls again
    return Assignments.model_validate({"assignments": hub.take(worker_id, body.credits)})


def _settled(core: Dispatcher, job_id: str) -> dict[str, Any]:
    job = core.job_view(job_id)
    if job is None:
        raise ApiError(404, f"no job {job_id!r}")
    return public_job(job)


@router.post("/jobs/{job_id}/ack", response_model=Settled)
async def ack(job_id: str, body: Ack, node: NodeDep, _principal: WorkerDep) -> Settled:
    """The attempt succeeded with `result`. A repeat of the same ack answers the same."""
    job = await node.call(
        lambda core, now: core.ack(
            job_id, body.attempt, body.lease, now, result=body.result, worker_id=body.worker_id
        ),
        lambda core, _events: _settled(core, job_id),
    )
    return Settled(id=job_id, status=job["status"])


@router.post("/jobs/{job_id}/fail", response_model=Settled)
async def fail(job_id: str, body: Fail, node: NodeDep, _principal: WorkerDep) -> Settled:
    """The attempt failed: retried with backoff if `retryable` and attempts remain, else dead."""
    job = await node.call(
        lambda core, now: core.fail(
            job_id, body.attempt, body.lease, now,
            error=body.error, retryable=body.retryable, worker_id=body.worker_id,
        ),
        lambda core, _events: _settled(core, job_id),
    )  # fmt: skip
    return Settled(id=job_id, status=job["status"])


@router.post("/jobs/{job_id}/heartbeat", response_model=HeartbeatAnswer)
async def heartbeat(
    job_id: str, body: Settle, node: NodeDep, _principal: WorkerDep
) -> HeartbeatAnswer:
    """Still working: the deadline moves to now + the attempt's timeout."""
    job = await node.call(
        lambda core, now: core.heartbeat(
            job_id, body.attempt, body.lease, now, worker_id=body.worker_id
        ),
        lambda core, _events: _settled(core, job_id),
    )
    return HeartbeatAnswer(id=job_id, deadline=job["deadline"])


@router.post("/jobs:ack", response_model=SettledBatch)
async def ack_batch(body: AckBatch, node: NodeDep, _principal: WorkerDep) -> SettledBatch:
    """Many acks in one request; each is answered on its own (a stale one does not stop others,
    nor does one naming another worker than the job's)."""
    refused: dict[str, Rejected] = {}
    by_worker: dict[str | None, list[tuple[str, int, str, Any]]] = {}
    for item in body.acks:
        by_worker.setdefault(item.worker_id, []).append(
            (item.id, item.attempt, item.lease, item.result)
        )

    def decide(core: Dispatcher, now: float) -> list[Event]:
        events: list[Event] = []
        for worker_id, acks in by_worker.items():
            settled, rejections = core.ack_many(acks, now, worker_id=worker_id)
            events += settled
            refused.update({rejection.job_id or "": rejection for rejection in rejections})
        return events

    def answer(core: Dispatcher, _events: list[Event]) -> list[Settled]:
        results = []
        for item in body.acks:
            rejection = refused.get(item.id)
            if rejection is not None:
                results.append(
                    Settled(id=item.id, error=rejection.code.value, detail=rejection.detail)
                )
            else:
                job = core.job_view(item.id)
                results.append(Settled(id=item.id, status=job.status.value if job else None))
        return results

    return SettledBatch(results=await node.call(decide, answer))

"""Workers: long-poll for assignments with credits, settle them by attempt and lease.

A worker id belongs to the key that registered it (admins may act for any): a poll for
another key's worker answers 403, and every settlement names its key, so the leader refuses
one for a job held by another key's worker. A worker served by an open WebSocket is polled
only through it (409): a poll would replace its credit and subjects under the socket.
A long-poll belongs to the leadership term it started under: when that term ends, it
answers 307 to the new leader (or 503) instead of waiting on.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import APIRouter

from api.deps import NodeDep, WorkerDep, owner_of
from api.errors import ApiError
from api.hub import Hub, public_job
from api.leader import LeaderUnavailable
from api.schemas import (
    Ack,
    AckBatch,
    Fail,
    HeartbeatAnswer,
    Poll,
    Settle,
    Settled,
    SettledBatch,
)
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import Event
from dispatch.wire import Assignments

router = APIRouter(prefix="/v1", tags=["workers"])


def present(
    core: Dispatcher,
    *,
    hub: Hub,
    worker_id: str,
    subjects: list[str],
    credits: int,
    now: float,
    owner: str | None = None,
) -> list[Event]:
    """A REST poll: (re)join if needed, say "I have room for `credits`", count as alive.

    Assignments already committed to this worker but not yet taken fill part of that room,
    so the grant is what is left of it. Another key's worker is refused before anything
    changes."""
    registered = core.worker_owner(worker_id)
    if owner is not None and registered is not None and registered != owner:
        raise Rejected(RejectCode.FORBIDDEN, f"worker id {worker_id!r} belongs to another key")
    events: list[Event] = []
    known = core.worker(worker_id)
    if known is None or list(known.subjects) != subjects:
        events += core.join(worker_id, subjects, now, owner=owner)
    room = max(0, credits - hub.undelivered(worker_id))
    events += core.grant_credit(worker_id, room, now, replace=True)
    events += core.worker_heartbeat(worker_id, now)
    return events


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
    await node.call(
        lambda core, now: present(
            core,
            hub=hub,
            worker_id=worker_id,
            subjects=body.subjects,
            credits=body.credits,
            now=now,
            owner=owner,
        )
    )
    outbox = hub.outbox(worker_id)
    if not outbox.items and body.wait_s > 0 and body.credits > 0:
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
    return Assignments.model_validate({"assignments": hub.take(worker_id, body.credits)})


def _settled(core: Dispatcher, job_id: str) -> dict[str, Any]:
    job = core.job_view(job_id)
    if job is None:
        raise ApiError(404, f"no job {job_id!r}")
    return public_job(job)


@router.post("/jobs/{job_id}/ack", response_model=Settled)
async def ack(job_id: str, body: Ack, node: NodeDep, principal: WorkerDep) -> Settled:
    """The attempt succeeded with `result`. A repeat of the same ack answers the same."""
    owner = owner_of(principal)
    job = await node.call(
        lambda core, now: core.ack(
            job_id,
            body.attempt,
            body.lease,
            now,
            result=body.result,
            worker_id=body.worker_id,
            owner=owner,
        ),
        lambda core, _events: _settled(core, job_id),
    )
    return Settled(id=job_id, status=job["status"])


@router.post("/jobs/{job_id}/fail", response_model=Settled)
async def fail(job_id: str, body: Fail, node: NodeDep, principal: WorkerDep) -> Settled:
    """The attempt failed: retried with backoff if `retryable` and attempts remain, else dead."""
    owner = owner_of(principal)
    job = await node.call(
        lambda core, now: core.fail(
            job_id, body.attempt, body.lease, now,
            error=body.error, retryable=body.retryable, worker_id=body.worker_id, owner=owner,
        ),
        lambda core, _events: _settled(core, job_id),
    )  # fmt: skip
    return Settled(id=job_id, status=job["status"])


@router.post("/jobs/{job_id}/heartbeat", response_model=HeartbeatAnswer)
async def heartbeat(
    job_id: str, body: Settle, node: NodeDep, principal: WorkerDep
) -> HeartbeatAnswer:
    """Still working: the deadline moves to now + the attempt's timeout."""
    owner = owner_of(principal)
    job = await node.call(
        lambda core, now: core.heartbeat(
            job_id, body.attempt, body.lease, now, worker_id=body.worker_id, owner=owner
        ),
        lambda core, _events: _settled(core, job_id),
    )
    return HeartbeatAnswer(id=job_id, deadline=job["deadline"])


@router.post("/jobs:ack", response_model=SettledBatch)
async def ack_batch(body: AckBatch, node: NodeDep, principal: WorkerDep) -> SettledBatch:
    """Many acks in one request; each is answered on its own (a stale one does not stop others,
    nor does one naming another worker than the job's)."""
    owner = owner_of(principal)
    refused: dict[str, Rejected] = {}
    by_worker: dict[str | None, list[tuple[str, int, str, Any]]] = {}
    for item in body.acks:
        by_worker.setdefault(item.worker_id, []).append(
            (item.id, item.attempt, item.lease, item.result)
        )

    def decide(core: Dispatcher, now: float) -> list[Event]:
        events: list[Event] = []
        for worker_id, acks in by_worker.items():
            settled, rejections = core.ack_many(acks, now, worker_id=worker_id, owner=owner)
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

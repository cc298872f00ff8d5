"""Operators: the dead-letter queue, live queue and worker views, who leads."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query

from dispatch.api.deps import AdminDep, AnyoneDep, NodeDep
from dispatch.api.leader import LeaderUnavailable
from dispatch.api.loop_commands import (
    ListDeadLetters,
    ListPauses,
    ListQueues,
    ListWorkers,
    RedriveJob,
    SetPause,
)
from dispatch.api.schemas import (
    LeaderView,
    PauseBody,
    PauseList,
    QueueList,
    WorkerList,
    error_responses,
)
from dispatch.wire import JobList, JobView

router = APIRouter(prefix="/v1", tags=["operations"])


@router.get("/dlq", response_model=JobList)
async def dead_letters(
    node: NodeDep,
    _principal: AdminDep,
    exec: str | None = Query(None, description="Only this exec"),
    limit: int = Query(100, ge=1, le=10_000),
) -> dict[str, Any]:
    """Dead-lettered jobs, oldest first, with their reason and last error."""

    return {"jobs": await node.call(ListDeadLetters(exec, limit))}


@router.post(
    "/dlq/{job_id}/redrive",
    response_model=JobView,
    responses=error_responses({404: "No such job", 409: "The job is not dead"}),
)
async def redrive(job_id: str, node: NodeDep, principal: AdminDep) -> dict[str, Any]:
    """Requeue a dead job with its attempts reset (409 if it is not dead). The key's name
    is recorded in the job's `redriven` event."""
    return await node.call(RedriveJob(job_id, by=principal.name))


PauseScopeParam = Literal["exec", "client"]
_PAUSE_ERRORS = error_responses({422: "The scope, pattern, client id or reason is refused"})


@router.get("/pauses", response_model=PauseList)
async def pauses(node: NodeDep, _principal: AdminDep) -> dict[str, Any]:
    """The pauses in force, oldest first."""
    return {"pauses": await node.call(ListPauses())}


@router.put("/pauses/{scope}/{target}", response_model=PauseList, responses=_PAUSE_ERRORS)
async def pause(
    scope: PauseScopeParam,
    target: str,
    node: NodeDep,
    principal: AdminDep,
    body: PauseBody | None = None,
) -> dict[str, Any]:
    """Pause an exec pattern's queues (`exec`: `image.*` one token, `image.>` one or more)
    or a client's jobs (`client`): nothing new of theirs starts, running jobs go on,
    submissions still queue. Pausing what is paused keeps the first pause. Answers the
    pauses in force. To purge what waits: `POST /v1/jobs/cancel` with `status: queued`."""
    reason = "" if body is None else body.reason
    command = SetPause(scope, target, True, by=principal.name, reason=reason)
    return {"pauses": await node.call(command)}


@router.delete("/pauses/{scope}/{target}", response_model=PauseList, responses=_PAUSE_ERRORS)
async def resume(
    scope: PauseScopeParam, target: str, node: NodeDep, principal: AdminDep
) -> dict[str, Any]:
    """Resume: end exactly this pause (resuming `image.*` leaves `image.>` paused); what it
    held starts at once. Answers the pauses in force."""
    command = SetPause(scope, target, False, by=principal.name)
    return {"pauses": await node.call(command)}


@router.get("/queues", response_model=QueueList)
async def queues(node: NodeDep, _principal: AdminDep) -> dict[str, Any]:
    return {"queues": await node.call(ListQueues())}


@router.get("/workers", response_model=WorkerList)
async def workers(node: NodeDep, _principal: AdminDep) -> dict[str, Any]:
    return {"workers": await node.call(ListWorkers())}


@router.get("/leader", response_model=LeaderView)
async def leader(node: NodeDep, _principal: AnyoneDep) -> LeaderView:
    try:
        term = node.leader()
    except LeaderUnavailable:
        return LeaderView(leader=None, node=node.address, is_leader=False, epoch=None)
    return LeaderView(leader=node.address, node=node.address, is_leader=True, epoch=term.core.epoch)

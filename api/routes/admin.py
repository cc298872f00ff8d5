"""Operators: the dead-letter queue, live queue and worker views, who leads."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query

from dispatch.api.deps import AdminDep, AnyoneDep, NodeDep
from dispatch.api.errors import ApiError
from dispatch.api.leader import LeaderUnavailable
from dispatch.api.loop_commands import (
    ListDeadLetters,
    ListLimits,
    ListPauses,
    ListQueues,
    ListWorkers,
    ReadLimit,
    RedriveJob,
    RemoveLimit,
    SetLimit,
    SetPause,
)
from dispatch.api.schemas import (
    LeaderView,
    LimitBody,
    LimitList,
    LimitRemovedAnswer,
    LimitScope,
    LimitView,
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


_LIMIT_ERRORS = error_responses(
    {422: "The scope, target, a knob (max_inflight, rate, burst) or the reason is refused"}
)


@router.get("/limits", response_model=LimitList)
async def limits(node: NodeDep, _principal: AdminDep) -> dict[str, Any]:
    """Every limit in force: the runtime ones (oldest first) and the settings' ones, each
    with the jobs it counts running (`inflight`) and the queued jobs it holds (`held`)."""
    return {"limits": await node.call(ListLimits())}


@router.get(
    "/limits/{scope}/{target:path}",
    response_model=LimitView,
    responses=error_responses({404: "No limit of that scope and target is in force"}),
)
async def read_limit(
    scope: LimitScope, target: str, node: NodeDep, _principal: AdminDep
) -> dict[str, Any]:
    """The limit in force for exactly this scope and target (a runtime one, else the
    settings' one)."""
    view = await node.call(ReadLimit(scope, target))
    if view is None:
        raise ApiError(404, f"no {scope} limit {target!r} is in force")
    return view


@router.put("/limits/{scope}/{target:path}", response_model=LimitView, responses=_LIMIT_ERRORS)
async def set_limit(
    scope: LimitScope, target: str, body: LimitBody, node: NodeDep, principal: AdminDep
) -> dict[str, Any]:
    """Set a runtime limit: at most `max_inflight` jobs running at once and/or at most
    `rate` starts a second (a token bucket of `burst`). Scopes: `client` (a client id: its
    `max_inflight` replaces the client's configured cap), `exec` (an exec pattern: one budget
    shared by every exec it matches), `key` (a concurrency key `account:42`, or a pattern
    ending in `*`, `account:*`: a budget for each key). It replaces wholly the limit of the
    same scope and target (the settings' one too, until removed). Running jobs go on when it
    is lowered; nothing new starts until they are below it. Answers the limit in force."""
    command = SetLimit(
        scope, target, max_inflight=body.max_inflight, rate=body.rate, burst=body.burst,
        by=principal.name, reason=body.reason,
    )  # fmt: skip
    view = await node.call(command)
    if view is None:  # the core keeps what it accepted: a bug if not
        raise ApiError(500, f"the {scope} limit {target!r} was set but is not in force")
    return view


@router.delete(
    "/limits/{scope}/{target:path}", response_model=LimitRemovedAnswer, responses=_LIMIT_ERRORS
)
async def remove_limit(
    scope: LimitScope, target: str, node: NodeDep, principal: AdminDep
) -> dict[str, Any]:
    """Remove the runtime limit of this scope and target (`removed` false: there was none);
    the settings' limit of the same scope and target applies again (`limit`, null: none).
    What it held starts at once, within the limits left."""
    removed, view = await node.call(RemoveLimit(scope, target, by=principal.name))
    return {"removed": removed, "limit": view}


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

"""Operators: the dead-letter queue, live queue and worker views, who leads."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from api.deps import AdminDep, AnyoneDep, NodeDep
from api.hub import public_job
from api.leader import LeaderUnavailable
from api.schemas import LeaderView, QueueList, WorkerList, error_responses
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Event
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

    def answer(core: Dispatcher, _events: list[Event]) -> dict[str, Any]:
        jobs = [job for job in core.dead_letters() if exec is None or job.exec == exec]
        return {"jobs": [public_job(job) for job in jobs[:limit]]}

    listing: dict[str, Any] = await node.read(answer)
    return listing


@router.post(
    "/dlq/{job_id}/redrive",
    response_model=JobView,
    responses=error_responses({404: "No such job", 409: "The job is not dead"}),
)
async def redrive(job_id: str, node: NodeDep, _principal: AdminDep) -> dict[str, Any]:
    """Requeue a dead job with its attempts reset (409 if it is not dead)."""
    job: dict[str, Any] = await node.call(
        lambda core, now: core.redrive(job_id, now),
        lambda core, _events: public_job(core.job_view(job_id)),
    )
    return job


@router.get("/queues", response_model=QueueList)
async def queues(node: NodeDep, _principal: AdminDep) -> dict[str, Any]:
    listing: dict[str, Any] = await node.read(
        lambda core, _events: {"queues": [stats.to_dict() for stats in core.queue_stats()]}
    )
    return listing


@router.get("/workers", response_model=WorkerList)
async def workers(node: NodeDep, _principal: AdminDep) -> dict[str, Any]:
    listing: dict[str, Any] = await node.read(
        lambda core, _events: {"workers": [worker.to_dict() for worker in core.workers()]}
    )
    return listing


@router.get("/leader", response_model=LeaderView)
async def leader(node: NodeDep, _principal: AnyoneDep) -> LeaderView:
    try:
        term = node.leader()
    except LeaderUnavailable:
        return LeaderView(leader=None, node=node.address, is_leader=False, epoch=None)
    return LeaderView(leader=node.address, node=node.address, is_leader=True, epoch=term.core.epoch)

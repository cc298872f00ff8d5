"""Clients: submit, read (with long-poll), cancel."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from fastapi import APIRouter, Query, Response

from dispatch.api.deps import AdminDep, ClientDep, NodeDep
from dispatch.api.errors import ApiError
from dispatch.api.hub import public_job
from dispatch.api.leader import Leader, LeaderUnavailable
from dispatch.api.loop_commands import CancelJob, CancelJobs, ReadJobs
from dispatch.api.node import Node
from dispatch.api.schemas import (
    BulkCancel,
    BulkCancelled,
    CancelBody,
    JobBatch,
    JobSubmission,
    error_responses,
)
from dispatch.auth import Principal, Role
from dispatch.core.commands import SubmitRequest
from dispatch.core.errors import RejectCode
from dispatch.core.job import TERMINAL_STATUSES, JobStatus
from dispatch.core.subjects import compile_pattern
from dispatch.wire import Accepted, AcceptedBatch, JobView

router = APIRouter(prefix="/v1", tags=["jobs"])
log = logging.getLogger(__name__)

_SUBMIT_ERRORS = error_responses(
    {
        403: "`client_id` names another client, and the key is not an admin's",
        409: "A job id is taken by another client (a batch then writes none of its jobs)",
        422: "A field is refused; `detail` names it (a batch then writes none of its jobs)",
    }
)
_JOB_ERRORS = error_responses({404: "No such job (or another client's)"})

MAX_WAIT_S = 60.0


def generated_ids(bodies: Sequence[JobSubmission], requests: Sequence[SubmitRequest]) -> set[str]:
    """The ids `to_request` made up (bodies without an id), which no earlier job has."""
    return {request.id for body, request in zip(bodies, requests, strict=True) if body.id is None}


def to_request(body: JobSubmission, principal: Principal, where: str = "body") -> SubmitRequest:
    foreign = body.client_id is not None and body.client_id != principal.client_id
    if foreign and principal.role is not Role.ADMIN:
        raise ApiError(403, f"{where}.client_id: only admins may submit for another client")
    try:
        return SubmitRequest(
            id=body.id if body.id is not None else uuid.uuid4().hex,
            exec=body.exec,
            payload=body.payload,
            client_id=body.client_id or principal.client_id,
            max_attempts=body.max_attempts,
            timeout_s=body.timeout_s,
            priority=body.priority,
            delay_s=body.delay_s,
            retry=None if body.retry is None else body.retry.model_dump(exclude_none=True),
            expires_at=body.expires_at,
            ttl_s=body.ttl_s,
            max_run_s=body.max_run_s,
            key=body.key,
        )
    except ValueError as error:
        raise ApiError(422, f"{where}.{error}") from None


def _visible(job: dict[str, Any] | None, principal: Principal, job_id: str) -> dict[str, Any]:
    # Another client's job answers exactly like a missing one: ids do not leak.
    if job is None or (
        principal.role is not Role.ADMIN and job["client_id"] != principal.client_id
    ):
        raise ApiError(404, f"no job {job_id!r}")
    return job


async def _known(node: Node, ids: list[str]) -> dict[str, dict[str, Any]]:
    return await node.call(ReadJobs(ids))


ARCHIVE_LOOKUP_S = 10.0
"""Longest wait for a Delta lookup of jobs the leader forgot (object storage may hang)."""


async def _archived(
    leader: Leader, ids: Sequence[str], *, strict: bool = False
) -> dict[str, dict[str, Any]]:
    """The jobs among `ids` that Delta holds (the leader forgot them: they finished before its
    finished window). Best effort: when Delta cannot be read within ARCHIVE_LOOKUP_S, nothing
    is found (and logged), so a submission is not refused because object storage is slow or
    away; with `strict` (a read of one job), a 503 instead, rather than a 404 that would say
    the job does not exist."""
    lookup = asyncio.to_thread(leader.archive.find_jobs, leader.group, ids)
    try:
        records = await asyncio.wait_for(lookup, ARCHIVE_LOOKUP_S)
    except Exception as error:  # noqa: BLE001  (see above)
        log.warning("cannot look up %d job ids in Delta: %r", len(ids), error)
        if strict:
            raise ApiError(
                503, "the job history (Delta) did not answer in time: try again", "unavailable"
            ) from None
        return {}
    return {job_id: public_job(record) for job_id, record in records.items()}


async def _finished_within_window(
    leader: Leader, requests: Sequence[SubmitRequest], known: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The jobs among `requests` the leader no longer holds that finished within the dedup
    window (answered as existing, as the ones it holds are). Only ids the filter of finished
    ids may hold are looked up in Delta: a new id costs a few microseconds."""
    finished_ids = leader.finished_ids
    maybe = [
        job_id
        for job_id in dict.fromkeys(request.id for request in requests)
        if job_id not in known and finished_ids.may_hold(job_id)
    ]
    if not maybe:
        return {}
    since = time.time() - leader.settings.dispatcher.dedup_window_s
    found = await _archived(leader, maybe)
    # A life that finished before the window (a false positive of the filter found an old
    # one) does not count: that id starts a new life.
    return {
        job_id: job
        for job_id, job in found.items()
        if job["status"] not in TERMINAL_STATUSES or job["updated_at"] >= since
    }


async def accept(
    node: Node,
    requests: list[SubmitRequest],
    principal: Principal,
    generated: Collection[str] = (),
) -> list[Accepted]:
    """Known ids answer with the existing job; the rest go to Kafka (202 once acknowledged).
    `generated`: ids this node made up for the request (no earlier job can have them)."""
    # Only the leader answers a submission: an answer it cannot give (a known id, another
    # tenant's, a client over its queues) would be a false 202. A follower relays the call
    # (dispatch.api.forward); a node that stopped leading since answers 307 or 503 here, and
    # the client retries (the same id dedups).
    # A membership test on the core's job dict is atomic under the GIL: it keeps the common
    # case (new ids) off the leader loop, and only ids seen there get a consistent read.
    leader = node.leader()
    core = leader.core
    seen = [request.id for request in requests if request.id in core]
    known = await _known(node, seen) if seen else {}
    # Beyond memory: a job that finished before the leader's finished window.
    asked = [request for request in requests if request.id not in generated]
    if asked:
        known.update(await _finished_within_window(leader, asked, known))
    # All or nothing: every refusal is found before anything is written.
    for request in requests:
        existing = known.get(request.id)
        taken = existing is not None and existing["client_id"] != principal.client_id
        if taken and principal.role is not Role.ADMIN:
            raise ApiError(409, f"job id {request.id!r} is taken")
    fresh = [request for request in requests if request.id not in known]
    refusal = core.exec_queues_refusal(fresh)
    if refusal is not None:
        # Early and best effort (two requests racing for a client's last queue may both pass:
        # the leader then rejects one to dispatch.submit.rejected); the rule is the core's.
        raise ApiError(422, refusal)
    await node.produce_submissions(fresh)
    # A job nobody serves would wait in silence: say so (only where this node's term knows
    # the workers; a follower knows none and warns about nothing).
    served = node.hub.served if node.hub is not None else None
    answers = []
    for request in requests:
        existing = known.get(request.id)
        if existing is None:
            warning = served.warning(request.exec) if served is not None else None
            answers.append(Accepted(id=request.id, status="queued", warning=warning))
        else:
            queued = existing["status"] in ("queued", "retrying")
            warning = served.warning(existing["exec"]) if queued and served is not None else None
            answers.append(
                Accepted(id=request.id, status=existing["status"], existing=True, warning=warning)
            )
    return answers


@router.post(
    "/jobs",
    status_code=202,
    response_model=Accepted,
    response_model_exclude_none=True,  # `warning` only when there is one
    responses={200: {"model": Accepted, "description": "The id was known"}, **_SUBMIT_ERRORS},
)
async def submit(
    body: JobSubmission, node: NodeDep, principal: ClientDep, response: Response
) -> Accepted:
    """Submit one job. Answered once Kafka has it; the same id again answers the existing job."""
    request = to_request(body, principal)
    [accepted] = await accept(node, [request], principal, generated_ids([body], [request]))
    if accepted.existing:
        response.status_code = 200
    return accepted


@router.post(
    "/jobs:batch",
    status_code=202,
    response_model=AcceptedBatch,
    response_model_exclude_none=True,
    responses=_SUBMIT_ERRORS,
)
async def submit_batch(body: JobBatch, node: NodeDep, principal: ClientDep) -> AcceptedBatch:
    """Submit many jobs, all or nothing: all are validated (fields, ids taken by another
    client) before any is written."""
    requests = [to_request(job, principal, f"body.jobs[{i}]") for i, job in enumerate(body.jobs)]
    generated = generated_ids(body.jobs, requests)
    return AcceptedBatch(jobs=await accept(node, requests, principal, generated))


@router.get("/jobs/{job_id}", response_model=JobView, responses=_JOB_ERRORS)
async def read_job(
    job_id: str,
    node: NodeDep,
    principal: ClientDep,
    wait: float = Query(0.0, ge=0, le=MAX_WAIT_S, description="Long-poll until terminal"),
) -> dict[str, Any]:
    """A job's status, attempts, result or error; `?wait=S` waits until it is terminal."""
    assert node.hub is not None
    deadline = time.monotonic() + wait
    looked_in_delta = False
    while True:
        # Registered before the read, so a job finishing in between still wakes us.
        waiter = node.hub.wait_for_job(job_id) if wait else None
        try:
            job = (await _known(node, [job_id])).get(job_id)
            if job is None and not looked_in_delta:
                # Not held: it finished before the leader's finished window (then Delta has
                # it, result and all), or it is unknown. Asked once: a job that appears
                # while we wait is a new one, and the leader holds it.
                looked_in_delta = True
                job = (await _archived(node.leader(), [job_id], strict=True)).get(job_id)
        except LeaderUnavailable:
            if waiter is not None:
                node.hub.forget_waiter(job_id, waiter)
            raise
        remaining = deadline - time.monotonic()
        if (
            waiter is None
            or remaining <= 0
            or (job is not None and job["status"] in TERMINAL_STATUSES)
        ):
            if waiter is not None:
                node.hub.forget_waiter(job_id, waiter)
            return _visible(job, principal, job_id)
        try:
            await asyncio.wait_for(waiter, timeout=remaining)
        except TimeoutError:
            node.hub.forget_waiter(job_id, waiter)


_CANCEL_ERRORS = {**_JOB_ERRORS, **error_responses({409: "The job has finished"})}


@router.delete("/jobs/{job_id}", response_model=JobView, responses=_CANCEL_ERRORS)
async def cancel(job_id: str, node: NodeDep, principal: ClientDep) -> dict[str, Any]:
    """Cancel a job, as `POST /v1/jobs/{id}/cancel` does without a reason."""
    return await _cancel(node, principal, job_id, "")


@router.post("/jobs/{job_id}/cancel", response_model=JobView, responses=_CANCEL_ERRORS)
async def cancel_with_reason(
    job_id: str, node: NodeDep, principal: ClientDep, body: CancelBody | None = None
) -> dict[str, Any]:
    """Cancel a job. Queued: it ends `cancelled` at once. Running: its worker is told to stop
    (the answer shows `cancelling`); it ends `cancelled` when the worker confirms, or after
    the cancel grace. A repeat answers the same; a finished job answers 409
    `not_cancellable`. The key's name is recorded in the job's events."""
    return await _cancel(node, principal, job_id, "" if body is None else body.reason)


async def _cancel(node: Node, principal: Principal, job_id: str, reason: str) -> dict[str, Any]:
    job = (await _known(node, [job_id])).get(job_id)
    if job is None:
        # Finished before the leader's window (Delta has it), or unknown (404).
        archived = (await _archived(node.leader(), [job_id], strict=True)).get(job_id)
        status = _visible(archived, principal, job_id)["status"]
        raise ApiError(
            409,
            f"job {job_id!r} is {status}; only queued and running jobs can be cancelled",
            RejectCode.NOT_CANCELLABLE.value,
        )
    _visible(job, principal, job_id)
    return await node.call(CancelJob(job_id, by=principal.name, reason=reason))


@router.post(
    "/jobs/cancel",
    response_model=BulkCancelled,
    responses=error_responses({422: "A field is refused; `detail` names it"}),
)
async def cancel_many(body: BulkCancel, node: NodeDep, principal: AdminDep) -> BulkCancelled:
    """Admins: cancel up to `limit` jobs of an exec pattern and/or a client, queued (a purge,
    the default), running, or any; oldest first. Call again while it cancels `limit`."""
    if body.exec is None and body.client_id is None:
        raise ApiError(
            422, "body: give exec and/or client_id (a bulk cancel of everything is refused)"
        )
    if body.exec is not None:
        try:
            compile_pattern(body.exec)
        except ValueError as error:
            raise ApiError(422, f"body.exec: {error}") from None
    statuses = _BULK_STATUSES[body.status]
    command = CancelJobs(
        body.exec, body.client_id, statuses, body.limit, by=principal.name, reason=body.reason
    )
    return BulkCancelled(**await node.call(command))


_BULK_STATUSES = {
    "queued": frozenset({JobStatus.QUEUED}),
    "running": frozenset({JobStatus.RUNNING}),
    "any": frozenset({JobStatus.QUEUED, JobStatus.RUNNING}),
}

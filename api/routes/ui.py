"""The operators' dashboard: static page at `/ui`, and the one JSON view it needs beyond the
REST contract (`GET /v1/overview`: in-flight jobs, recent failures and finishes, history).

The page is plain HTML, CSS and JavaScript from `api/ui/` (no build step, nothing fetched from
elsewhere: its Content-Security-Policy allows this origin only). It asks for an API key and
calls the admin endpoints with it; the page itself is not secret, so serving it needs no key.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from dispatch.api.deps import AdminDep, NodeDep
from dispatch.api.errors import ApiError
from dispatch.api.loop_commands import ReadOverview
from dispatch.api.node import Node
from dispatch.api.ui_history import History, Sampler

log = logging.getLogger(__name__)

router = APIRouter()

UI_DIR = Path(__file__).resolve().parent.parent / "ui"

_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    # ES modules are refused unless served with a JavaScript type.
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}

# Everything the page loads comes from this origin; it may not be framed, nor post forms.
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Small files: revalidating every load means a new version shows without a hard refresh.
    "Cache-Control": "no-cache",
}

HISTORY_CAPACITY = 300
"""Points the history keeps: five minutes at one a second."""

SAMPLE_INTERVAL_S = 1.0


def _static_files() -> dict[str, Path]:
    """The servable files by name. A fixed table, so no request path reaches the disk."""
    if not UI_DIR.is_dir():
        # An install without the package data: the API must still serve; /ui answers 404.
        log.warning("no dashboard files at %s: /ui is not served", UI_DIR)
        return {}
    return {
        path.name: path
        for path in sorted(UI_DIR.iterdir())
        if path.is_file() and path.suffix in _MEDIA_TYPES
    }


_STATIC = _static_files()


def _file(path: Path) -> FileResponse:
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers=_PAGE_HEADERS)


def _sampler(request: Request) -> Sampler:
    """This app's sampler of its node's metrics (one per app: tests run several nodes in one
    process), started on first use."""
    state = request.app.state
    sampler: Sampler | None = getattr(state, "ui_sampler", None)
    if sampler is None:
        node: Node = state.node
        sampler = Sampler(
            node.metrics.registry, History(HISTORY_CAPACITY), interval_s=SAMPLE_INTERVAL_S
        )
        state.ui_sampler = sampler
    sampler.ensure_started()
    return sampler


@router.get("/ui", include_in_schema=False)
async def page(request: Request) -> FileResponse:
    """The dashboard. Sampling starts now, so the charts have points by the first refresh."""
    _sampler(request)
    index = _STATIC.get("index.html")
    if index is None:
        raise ApiError(404, "the dashboard's files are not installed")
    return _file(index)


@router.get("/ui/static/{name}", include_in_schema=False)
async def static_file(name: str) -> FileResponse:
    path = _STATIC.get(name)
    if path is None or name == "index.html":  # the page itself is /ui
        raise ApiError(404, f"no file {name!r}")
    return _file(path)


# --- the overview --------------------------------------------------------------------------


class JobSummary(BaseModel):
    """A job without its payload and result (they can be large; `/v1/jobs/{id}` has them)."""

    id: str
    client_id: str
    exec: str
    status: str
    attempts: int
    max_attempts: int
    worker_id: str | None
    deadline: float | None
    submitted_at: float
    updated_at: float
    error: str | None
    dead_reason: str | None


class InFlight(BaseModel):
    total: int = Field(description="Jobs running now")
    jobs: list[JobSummary] = Field(description="Up to `limit` of them, nearest deadline first")


class HistoryPoint(BaseModel):
    """One interval of the node's metrics: rates in jobs per second, latencies in seconds
    (estimated from histogram buckets; null when nothing was observed), gauges at its end."""

    t: float = Field(description="End of the interval, Unix seconds")
    enqueued: float
    assigned: float
    completed: float
    dead: float
    requeued: float
    dispatch_p50: float | None = Field(description="Submission to first assignment")
    dispatch_p95: float | None
    dispatch_p99: float | None
    commit_p50: float | None = Field(description="Kafka transaction commit time")
    commit_p95: float | None
    commit_p99: float | None
    queued: float
    in_flight: float


class Overview(BaseModel):
    node: str = Field(description="This node's base URL")
    epoch: int = Field(description="The leader epoch this node serves")
    server_time: float = Field(description="The leader's clock, Unix seconds")
    counts: dict[str, int] = Field(description="Jobs held, by status")
    in_flight: InFlight
    recent_failures: list[JobSummary] = Field(
        description="Newest first: dead letters, and running jobs retried after a failure"
    )
    recently_finished: list[JobSummary] = Field(description="Succeeded or cancelled, newest first")
    history_interval_s: float
    history: list[HistoryPoint] = Field(description="Oldest first, after `since` if given")


@router.get("/v1/overview", response_model=Overview, tags=["operations"])
async def overview(
    request: Request,
    node: NodeDep,
    _principal: AdminDep,
    limit: int = Query(50, ge=1, le=1000, description="Longest list of jobs in each part"),
    since: float | None = Query(None, description="Only history points after this time"),
) -> dict[str, Any]:
    """What the dashboard shows beyond `/v1/queues`, `/v1/workers`, `/v1/dlq` and
    `/v1/leader`: in-flight jobs, recent failures and finishes, and a per-second history of
    throughput, latency and backlog (kept for five minutes from the first dashboard request)."""
    sampler = _sampler(request)
    state = await node.call(ReadOverview(limit))
    points = sampler.history.points(since)
    return {
        "node": node.address,
        **state,
        "history_interval_s": sampler.interval_s,
        "history": [point.to_dict() for point in points],
    }

"""Tenant service levels (`GET /v1/tenants`, admin): per client and exec over the last minutes,
what the streaming fold counted in the Delta `stats` table (submitted, started, completed, dead,
queue-wait percentiles, breaches of the client's wait target) beside what the leader holds now
(queued and running jobs).

The Delta read is delta-rs in a worker thread (`asyncio.to_thread`), never on the event loop;
the live counts are a read command on the leader loop like every other read of the core."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from dispatch.api.deps import AdminDep, NodeDep
from dispatch.api.loop_commands import ListLimits, ListPauses, ReadClientLoads
from dispatch.core.queries import ClientLoad, ClientLoads
from dispatch.delta.tenants import (
    TenantReport,
    TenantTotals,
    read_window,
    tenant_reports,
    window_start,
)
from dispatch.settings import TenantSettings
from dispatch.warehouse import Warehouse

router = APIRouter(prefix="/v1", tags=["operations"])

MAX_WINDOW_MINUTES = 1440
"""The longest window: a day of per-minute rows."""


class TenantFigures(BaseModel):
    """Counts over the window (from `stats`, by event time) and now (from the leader)."""

    queued: int = Field(description="Queued now (ready, at the client's cap, or delayed)")
    running: int = Field(description="Running now")
    submitted: int
    started: int = Field(description="Attempts started (first ones and retries)")
    completed: int
    dead: int
    queue_wait_n: int = Field(description="Waits measured (one per assignment)")
    queue_wait_p50_s: float | None = Field(description="Estimated from histograms (≤ ~4.4 %)")
    queue_wait_p95_s: float | None
    queue_wait_p99_s: float | None
    queue_wait_max_s: float | None = Field(description="The longest wait, exact")
    breaches: int = Field(
        description="Waits longer than the client's target (the target taken at the nearest "
        "histogram bucket boundary, within ~4.4 %)"
    )


class ExecTenant(TenantFigures):
    exec: str


class TenantLimit(BaseModel):
    max_inflight: int | None = Field(description="Its jobs running at once (null: no bound)")
    rate: float | None = Field(description="Its starts per second (null: no bound)")
    burst: int | None
    source: str = Field(description="runtime (set through /v1/limits) or settings")


class Tenant(TenantFigures):
    client_id: str
    paused: bool = Field(False, description="A pause holds the client: nothing new starts")
    limit: TenantLimit | None = Field(
        None, description="The client limit in force (`/v1/limits/client/{client_id}`), or null"
    )
    wait_target_s: float = Field(description="The client's queue-wait target (settings)")
    execs: list[ExecTenant] = Field(description="Per exec, by name")


_TENANT_LIMIT_FIELDS = tuple(TenantLimit.model_fields)


class TenantList(BaseModel):
    group: str = Field(description="The dispatcher group of this leader")
    minutes: int = Field(description="The window's length in minutes (the current one included)")
    since: float = Field(description="Start of the window's first minute, Unix seconds")
    until: float = Field(description="The server's time when read, Unix seconds")
    tenants: list[Tenant] = Field(
        description="By client id: every client with statistics in the window or jobs now"
    )


def _figures(totals: TenantTotals, live: ClientLoad) -> dict[str, Any]:
    return {"queued": live.queued, "running": live.running, **totals.columns()}


def tenant_list(
    reports: dict[str, TenantReport],
    loads: ClientLoads,
    tenants: TenantSettings,
    paused: frozenset[str] = frozenset(),
    limits: Mapping[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The window's reports joined with the live loads; a client with jobs now but none in
    the statistics (a new one, or one whose jobs never started), paused, or limited, is
    listed with zero counts. `limits`: the client limits in force, by client id."""
    limits = limits or {}
    live_execs: dict[str, dict[str, ClientLoad]] = {}
    for (client_id, exec_name), load in loads.by_client_exec.items():
        live_execs.setdefault(client_id, {})[exec_name] = load
    live_totals = loads.per_client()
    out: list[dict[str, Any]] = []
    for client_id in sorted(reports.keys() | live_execs.keys() | paused | limits.keys()):
        report = reports.get(client_id)
        if report is None:
            report = TenantReport(client_id, tenants.wait_target_for(client_id)).finish()
        now = live_execs.get(client_id, {})
        total_load = live_totals.get(client_id, ClientLoad())
        execs = [
            {
                "exec": exec_name,
                **_figures(
                    report.execs.get(exec_name, TenantTotals()), now.get(exec_name, ClientLoad())
                ),
            }
            for exec_name in sorted(report.execs.keys() | now.keys())
        ]
        out.append(
            {
                "client_id": client_id,
                "paused": client_id in paused,
                "limit": limits.get(client_id),
                "wait_target_s": report.target_s,
                **_figures(report.total, total_load),
                "execs": execs,
            }
        )
    return out


@router.get("/tenants", response_model=TenantList)
async def tenants(
    node: NodeDep,
    _principal: AdminDep,
    minutes: int = Query(
        15, ge=1, le=MAX_WINDOW_MINUTES, description="The window: this many minutes up to now"
    ),
) -> dict[str, Any]:
    """Per client, and per exec within it, over the last `minutes`: what the streaming fold
    counted (`stats`, fresh to its last micro-batch) — submitted, started, completed, dead,
    queue-wait p50/p95/p99 and the waits longer than the client's target — and the client's
    queued and running jobs now. An empty list before the fold wrote any statistics."""
    settings = node.settings
    group = settings.dispatcher.group
    # The leader's clock, read with its live counts, ends the window.
    loads, until = await node.call(ReadClientLoads())
    paused = frozenset(
        pause["target"] for pause in await node.call(ListPauses()) if pause["scope"] == "client"
    )
    limits = {
        view["target"]: {name: view[name] for name in _TENANT_LIMIT_FIELDS}
        for view in await node.call(ListLimits())
        if view["scope"] == "client"
    }
    since = window_start(until, minutes)
    rows = await asyncio.to_thread(read_window, Warehouse.of(settings), group, since, until)
    reports = tenant_reports(rows, settings.tenants.wait_target_for)
    return {
        "group": group,
        "minutes": minutes,
        "since": since,
        "until": until,
        "tenants": tenant_list(reports, loads, settings.tenants, paused, limits),
    }

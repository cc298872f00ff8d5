"""The FastAPI application of one node: REST contract, WebSocket stream, health and metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from api import errors
from api.auth import KeyRing
from api.node import Node
from api.routes import admin, jobs, stream, ui, workers
from dispatch.settings import Settings


def create_app(settings: Settings, node: Node, keyring: KeyRing) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await node.start()
        try:
            yield
        finally:
            await node.stop()

    app = FastAPI(
        title="dispatch",
        version="0.1.0",
        summary="A job dispatcher centred on Spark Structured Streaming",
        lifespan=lifespan,
    )
    app.state.node = node
    app.state.keyring = keyring
    errors.install(app)
    for router in (jobs.router, workers.router, admin.router, stream.router, ui.router):
        app.include_router(router)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process answers."""
        return {"status": "ok", "node": node.node_id}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """200 only on a leader whose rebuild is complete."""
        ready = node.ready
        lease = node.election.lease
        body = {
            "ready": ready,
            "node": node.address,
            "role": "leader" if lease is not None else "follower",
            "leader": node.election.leader_address,
            "epoch": lease.epoch if lease is not None else None,
            "terms": node.terms,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["health"])
    async def metrics() -> Response:
        return Response(await node.render_metrics(), media_type="text/plain; version=0.0.4")

    # Outermost, so an oversized body is refused before anything reads it.
    app.add_middleware(errors.PayloadLimit, limit=settings.api.max_payload_bytes)
    return app

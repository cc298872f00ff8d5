"""The FastAPI application of one node: REST contract, WebSocket stream, health and metrics."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import BaseRoute

from dispatch.api import errors
from dispatch.api.deps import get_node, get_principal
from dispatch.api.forward import Forwarder, ForwardToLeader
from dispatch.api.node import Node
from dispatch.api.routes import admin, jobs, stream, tenants, ui, workers
from dispatch.api.schemas import ErrorBody, NotLeaderBody, ValidationErrorBody
from dispatch.api.submit_fast_path import SubmitFastPath
from dispatch.auth import KeyRing
from dispatch.settings import Settings


def create_app(settings: Settings, node: Node, keyring: KeyRing) -> FastAPI:
    forwarder = Forwarder(node, node.metrics)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await node.start()
        try:
            yield
        finally:
            await forwarder.close()
            await node.stop()

    app = FastAPI(
        title="dispatch",
        version="0.1.0",
        summary="A job dispatcher centred on Spark Structured Streaming",
        lifespan=lifespan,
        # FastAPI's native OpenTelemetry looks up the global providers on every request even
        # when none is configured; the node's own /metrics (Prometheus) is what it exports.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.node = node
    app.state.keyring = keyring
    # The per-tenant series' bound is a setting; Node builds its Metrics without settings.
    node.metrics.tenant_series = settings.tenants.metrics_clients
    errors.install(app)
    routers = (jobs.router, workers.router, admin.router, tenants.router, stream.router, ui.router)
    for router in routers:
        app.include_router(router)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process answers."""
        return {"status": "ok", "node": node.node_id}

    @app.get(
        "/readyz",
        tags=["health"],
        responses={503: {"description": "Not ready (the same body, with `ready` false)"}},
    )
    async def readyz() -> JSONResponse:
        """200 only on a leader whose rebuild is complete and whose loop is working (it
        completed an iteration and heard from Kafka within a bound); `reason` says why not."""
        reason = node.not_ready_reason()
        ready = reason is None
        lease = node.election.lease
        body = {
            "ready": ready,
            "reason": reason,
            "node": node.address,
            "role": "leader" if lease is not None else "follower",
            "leader": node.election.leader_address,
            "epoch": lease.epoch if lease is not None else None,
            "terms": node.terms,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get(
        "/metrics",
        tags=["health"],
        # Prometheus text, documented as what it is (not FastAPI's default JSON).
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def metrics() -> Response:
        return Response(await node.render_metrics(), media_type="text/plain; version=0.0.4")

    # The common single-job submission, without FastAPI's per-request layers; inside the
    # payload limit (added after it, so outside: middleware added last runs first).
    app.add_middleware(SubmitFastPath, node=node, keyring=keyring)
    # Before the fast path: on a follower, a submission is the leader's to answer. The worker
    # routes are not forwarded (workers follow the 307 to the leader once and stay there).
    worker_routes = [
        route.path_regex for route in workers.router.routes if isinstance(route, APIRoute)
    ]
    app.add_middleware(ForwardToLeader, forwarder=forwarder, local=worker_routes)
    # Outermost, so an oversized body is refused before anything reads it.
    app.add_middleware(errors.PayloadLimit, limit=settings.api.max_payload_bytes)
    _document_errors(app, [route for router in routers for route in router.routes])
    return app


_Answers = dict[int, tuple[str, type[BaseModel]]]

_ANY_ROUTE: _Answers = {
    307: (
        "Not the leader (a worker's call on a follower, or leadership moving during the "
        "call): the same request goes to the leader (`Location`)",
        NotLeaderBody,
    ),
    503: ("No leader right now (a failover under way): retry after `Retry-After`", ErrorBody),
}
_FORWARDED: _Answers = {
    502: (
        "A follower got no readable answer from the leader: the call may have been done",
        ErrorBody,
    ),
    504: (
        "A follower got no answer from the leader in time: the call may have been done",
        ErrorBody,
    ),
}
_WITH_KEY: _Answers = {401: ("Missing or unknown API key", ErrorBody)}
_WITH_ROLE: _Answers = {403: ("The key's role may not do this", ErrorBody)}
_WITH_BODY: _Answers = {
    400: ("The body could not be read as JSON", ErrorBody),
    413: ("The body is over the size limit", ErrorBody),
}
_NAMED: _Answers = {404: ("Nothing by that name", ErrorBody)}
_COMMAND: _Answers = {
    **_NAMED,
    409: ("The state refuses the command (a settled job, a stale lease, ...)", ErrorBody),
}
_INVALID = "Refused input: `detail` (and `fields`) name each refused field"


def _document_errors(app: FastAPI, routes: list[BaseRoute]) -> None:
    """Make the OpenAPI document say what the server answers: every error is `dispatch.api.errors`'s
    JSON body (FastAPI documents its own 422 array instead), with the statuses each route
    can answer (a key, a role, a leader, a body). Routes may name more with `responses=`."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _describe(generate(), routes)
        return app.openapi_schema or {}

    # Replacing the method is FastAPI's documented way to extend the document.
    app.openapi = openapi  # type: ignore[method-assign]


def _describe(document: dict[str, Any], routes: list[BaseRoute]) -> None:
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for model in (ErrorBody, ValidationErrorBody, NotLeaderBody):
        schemas.setdefault(model.__name__, _schema_of(model))
    for route in routes:
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        calls = set(_calls(route.dependant))
        for method in route.methods or ():
            operation = document["paths"].get(route.path_format, {}).get(method.lower())
            if operation is None:
                continue
            answers = operation.setdefault("responses", {})
            extra: _Answers = {}
            if get_node in calls:
                extra |= _ANY_ROUTE
                if route not in workers.router.routes:
                    extra |= _FORWARDED  # a follower relays the call (`dispatch.api.forward`)
            if get_principal in calls:
                extra |= _WITH_KEY
                operation["security"] = [{"bearer": []}]
            if any(getattr(call, "__qualname__", "").startswith("require.") for call in calls):
                extra |= _WITH_ROLE
            if "requestBody" in operation:
                extra |= _WITH_BODY
            if "{" in route.path_format:
                # A command on a named job or worker: what the core refuses (`Rejected`).
                command = get_node in calls and method in ("POST", "DELETE")
                extra |= _COMMAND if command else _NAMED
            for status, (description, body) in extra.items():
                answers.setdefault(str(status), _answer(description, body))
            if "422" in answers:
                # FastAPI's own says "Validation Error" with its array schema; a route's own
                # description stays.
                description = answers["422"].get("description", "Validation Error")
                if description == "Validation Error":
                    description = _INVALID
                answers["422"] = _answer(description, ValidationErrorBody)
    components.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key: `Authorization: Bearer <key>`",
    }
    # FastAPI's own 422 schemas, now unused (the second is used by the first only).
    for name in ("HTTPValidationError", "ValidationError"):
        if f'"#/components/schemas/{name}"' not in json.dumps([document["paths"], schemas]):
            schemas.pop(name, None)


def _answer(description: str, model: type[BaseModel]) -> dict[str, Any]:
    reference = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"description": description, "content": {"application/json": {"schema": reference}}}


def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(ref_template="#/components/schemas/{model}")


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    """Every dependency a route runs, however deep."""
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)

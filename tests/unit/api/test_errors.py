"""The follower's Location header (the request as the client sent it, always encoded), and
how a validation refusal names its fields."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.requests import Request

from dispatch.api import errors
from dispatch.api.errors import target_of


def _request(raw_path: bytes, query: bytes = b"", path: str = "") -> Request:
    return Request(
        {"type": "http", "method": "GET", "path": path or raw_path.decode("latin-1"),
         "raw_path": raw_path, "query_string": query, "headers": []}
    )  # fmt: skip


def test_an_encoded_path_and_query_stay_as_they_were_sent() -> None:
    request = _request(b"/v1/jobs/caf%C3%A9%0D%0Ax", b"wait=5&x=%0d%0a", path="/v1/jobs/café\r\nx")
    assert target_of(request.scope) == "/v1/jobs/caf%C3%A9%0D%0Ax?wait=5&x=%0d%0a"


def test_raw_bytes_that_no_header_may_hold_are_percent_encoded() -> None:
    target = target_of(_request("/v1/jobs/é\r\n x".encode(), "a=é\n".encode()).scope)
    assert target == "/v1/jobs/%C3%A9%0D%0A%20x?a=%C3%A9%0A"
    assert target.isascii() and "\r" not in target and "\n" not in target


def test_without_a_raw_path_the_decoded_path_is_encoded() -> None:
    request = Request({"type": "http", "method": "GET", "path": "/v1/jobs/é", "headers": []})
    assert target_of(request.scope) == "/v1/jobs/%C3%A9"


class Job(BaseModel):
    exec: str


class Batch(BaseModel):
    jobs: list[Job]


def test_a_validation_refusal_names_list_positions_as_the_routes_do() -> None:
    # The routes' own refusals say `body.jobs[1].exec`; FastAPI's validation must not say
    # `body.jobs.1.exec` for the same field.
    app = FastAPI()
    errors.install(app)

    @app.post("/batch")
    async def batch(body: Batch) -> int:
        return len(body.jobs)

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
            return await client.post("/batch", json={"jobs": [{"exec": "a"}, {"exec": 5}]})

    answer = asyncio.run(post())
    assert answer.status_code == 422
    assert answer.json()["fields"] == ["body.jobs[1].exec: Input should be a valid string"]

"""The follower's relay (`dispatch.api.forward`) against stand-in leaders on loopback sockets:
one that answers, one that answers garbage, one that hangs up, one that never answers, and
none at all. Whatever the leader does, the caller gets its answer or a JSON error, never a
500, and never a 202 the leader did not give."""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, ParamSpec

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from dispatch.api import forward
from dispatch.api.errors import PayloadLimit
from dispatch.api.forward import FORWARDED_HEADER, Forwarder, ForwardToLeader
from dispatch.api.leader import LeaderUnavailable
from dispatch.api.node import Node
from dispatch.settings import load_settings
from dispatch.stack.ports import free_port

LIMIT = 1000
WORKER_ROUTES = [re.compile(r"^/v1/workers/(?P<worker_id>[^/]+)/poll$")]

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]
P = ParamSpec("P")


def run(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """An async test run on an event loop of its own (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def sync(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return sync


class Leader:
    """A stand-in leader: a loopback server whose answer to each request is `answer`."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        body = await reader.readexactly(int(length.group(1))) if length else b""
        self.requests.append(head + body)
        try:
            await self.answer(head, writer)
        finally:
            writer.close()


@asynccontextmanager
async def leader_answering(answer: Answer) -> AsyncIterator[Leader]:
    leader = Leader(answer)
    server = await asyncio.start_server(leader._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    leader.url = f"http://127.0.0.1:{port}"
    async with server:
        yield leader


async def answers_json(_head: bytes, writer: asyncio.StreamWriter) -> None:
    body = b'{"id": "X", "status": "queued", "existing": true}'
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-leader: yes\r\n"
        b"connection: keep-alive\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()


async def redirects(_head: bytes, writer: asyncio.StreamWriter) -> None:
    body = b'{"error": "not_leader", "detail": "moved", "leader": "http://elsewhere"}'
    writer.write(
        b"HTTP/1.1 307 Temporary Redirect\r\nlocation: http://elsewhere/v1/jobs\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()


async def answers_garbage(_head: bytes, writer: asyncio.StreamWriter) -> None:
    writer.write(b"\x00\xffthis is not HTTP\r\n\r\n")
    await writer.drain()


async def hangs_up(_head: bytes, _writer: asyncio.StreamWriter) -> None:
    pass


async def never_answers(_head: bytes, _writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)


class Inner:
    """The node's own routes: records what reached them."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"local"})


def follower_of(leader_url: str | None) -> tuple[httpx.AsyncClient, Inner, Forwarder]:
    """A client of a follower node whose leader is `leader_url` (None: no leader known)."""
    node = Node(load_settings(), "f1", "http://127.0.0.1:1")

    def not_leading() -> None:
        if leader_url is None:
            raise LeaderUnavailable("no leader is ready yet")
        raise LeaderUnavailable(f"{leader_url} leads", leader=leader_url)

    node.leader = not_leading  # type: ignore[assignment,method-assign]
    inner = Inner()
    forwarder = Forwarder(node, node.metrics)
    app = PayloadLimit(ForwardToLeader(inner, forwarder, WORKER_ROUTES), limit=LIMIT)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://follower",
        headers={"Authorization": "Bearer k1"},
    )
    return client, inner, forwarder


async def _close(client: httpx.AsyncClient, forwarder: Forwarder) -> None:
    await client.aclose()
    await forwarder.close()


@run
async def test_the_leaders_answer_is_relayed_unchanged() -> None:
    async with leader_answering(answers_json) as leader:
        client, inner, forwarder = follower_of(leader.url)
        try:
            answer = await client.post("/v1/jobs?x=%0D%0A", json={"id": "X", "exec": "a.b"})
        finally:
            await _close(client, forwarder)
    assert answer.status_code == 200
    assert answer.json() == {"id": "X", "status": "queued", "existing": True}
    assert answer.headers["x-leader"] == "yes"
    assert inner.paths == []
    [request] = leader.requests
    assert request.startswith(b"POST /v1/jobs?x=%0D%0A HTTP/1.1\r\n")
    assert b"\r\nauthorization: bearer k1\r\n" in request.lower()  # the caller's key
    assert FORWARDED_HEADER + b": http://127.0.0.1:1" in request.lower()
    assert request.endswith(b'{"id":"X","exec":"a.b"}')


@pytest.mark.parametrize(
    ("target", "sent"),
    [
        ("/v1/jobs/..", "/v1/jobs/%2E%2E"),
        ("/v1/jobs/./x%2Fy?a=../b", "/v1/jobs/%2E/x%2Fy?a=../b"),
        ("/v1/jobs/a..b/.x", "/v1/jobs/a..b/.x"),
    ],
)
def test_dot_segments_reach_the_leader_as_the_caller_sent_them(target: str, sent: str) -> None:
    # httpx would resolve `..` (the job id `..` would read `/v1`); encoded, the leader
    # decodes it into the same path parameter as a direct call.
    assert forward._kept_dot_segments(target) == sent


@pytest.mark.parametrize(
    ("answer", "status", "error"),
    [(answers_garbage, 502, "bad_gateway"), (hangs_up, 502, "bad_gateway")],
)
@run
async def test_a_leader_answering_garbage_or_hanging_up_is_a_502(
    answer: Answer, status: int, error: str
) -> None:
    async with leader_answering(answer) as leader:
        client, _inner, forwarder = follower_of(leader.url)
        try:
            answered = await client.post("/v1/jobs", json={"id": "X", "exec": "a.b"})
        finally:
            await _close(client, forwarder)
    assert answered.status_code == status
    assert answered.json()["error"] == error
    assert "same id" in answered.json()["detail"]


@run
async def test_a_leader_that_stopped_leading_is_a_503_not_a_redirect() -> None:
    # Its route did nothing (it did not lead any more): the caller retries, on any node.
    async with leader_answering(redirects) as leader:
        client, _inner, forwarder = follower_of(leader.url)
        try:
            answered = await client.get("/v1/jobs/X")
        finally:
            await _close(client, forwarder)
    assert answered.status_code == 503
    assert answered.headers["retry-after"] == "1"
    assert "location" not in answered.headers


@run
async def test_a_leader_that_never_answers_is_a_504(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forward, "ANSWER_S", 0.3)
    monkeypatch.setattr(forward, "WAIT_MARGIN_S", 0.2)
    async with leader_answering(never_answers) as leader:
        client, _inner, forwarder = follower_of(leader.url)
        try:
            answered = await client.get("/v1/jobs/X")
        finally:
            await _close(client, forwarder)
    assert answered.status_code == 504
    assert answered.json()["error"] == "gateway_timeout"


@run
async def test_an_unreachable_leader_is_a_503_with_retry_after() -> None:
    client, _inner, forwarder = follower_of(f"http://127.0.0.1:{free_port()}")
    try:
        answered = await client.post("/v1/jobs", json={"id": "X", "exec": "a.b"})
    finally:
        await _close(client, forwarder)
    assert answered.status_code == 503
    assert answered.headers["retry-after"] == "1"
    assert answered.json()["error"] == "unavailable"


@run
async def test_without_a_leader_a_submission_is_a_503_and_other_calls_go_to_the_routes() -> None:
    client, inner, forwarder = follower_of(None)
    try:
        for path in ("/v1/jobs", "/v1/jobs:batch"):
            refused = await client.post(path, json={"id": "X", "exec": "a.b"})
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
        assert (await client.get("/v1/leader")).status_code == 299
    finally:
        await _close(client, forwarder)
    assert inner.paths == ["/v1/leader"]


@run
async def test_local_routes_and_forwarded_calls_are_never_forwarded() -> None:
    async with leader_answering(answers_json) as leader:
        client, inner, forwarder = follower_of(leader.url)
        try:
            polled = await client.post("/v1/workers/w1/poll", json={})
            health = await client.get("/healthz")
            looped = await client.get(
                "/v1/jobs/X", headers={FORWARDED_HEADER.decode(): "http://elsewhere"}
            )
        finally:
            await _close(client, forwarder)
    assert (polled.status_code, health.status_code) == (299, 299)
    assert inner.paths == ["/v1/workers/w1/poll", "/healthz"]
    # A node asked by another node, and not leading: leadership moved, no second hop.
    assert looped.status_code == 503 and looped.headers["retry-after"] == "1"
    assert leader.requests == []


@run
async def test_a_body_over_the_limit_is_refused_before_it_is_forwarded() -> None:
    async with leader_answering(answers_json) as leader:
        client, _inner, forwarder = follower_of(leader.url)

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"x" * 400

        try:
            declared = await client.post("/v1/jobs", content=b"x" * (LIMIT + 1))
            chunked = await client.post("/v1/jobs", content=chunks())
        finally:
            await _close(client, forwarder)
    assert declared.status_code == chunked.status_code == 413
    assert leader.requests == []


@pytest.mark.parametrize(
    ("method", "target", "wait"),
    [
        ("GET", "/v1/jobs/X?wait=30", 30.0),
        ("GET", "/v1/jobs/X?wait=1e9", 60.0),
        ("GET", "/v1/jobs/X?wait=nan", 0.0),
        ("GET", "/v1/jobs/X?wait=soon", 0.0),
        ("GET", "/v1/jobs/X", 0.0),
        ("POST", "/v1/jobs?wait=30", 0.0),
    ],
)
def test_a_long_polls_wait_extends_the_time_given_to_the_leader(
    method: str, target: str, wait: float
) -> None:
    path, _, query = target.partition("?")
    scope = {"method": method, "path": path, "query_string": query.encode()}
    assert forward._wait_of(scope) == wait

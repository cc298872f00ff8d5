"""The SDK's own transports (`dispatch.http_transport`: urllib3 for `Client`, aiohttp for
`AsyncClient`) against real sockets: a small HTTP/1.1 node in a thread of this process, a
closed port, and a port that accepts but never answers."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
import pytest

from dispatch.client import AsyncClient, Client, Unreachable
from dispatch.http_transport import (
    Answer,
    AsyncTransport,
    Headers,
    SyncTransport,
    TransportError,
)
from dispatch.stack.ports import free_port


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Node:
    url: str
    seen: list[Seen] = field(default_factory=list)
    peers: set[tuple[str, int]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: connections are reused
    node: Node

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        node = self.server.node  # type: ignore[attr-defined]
        with node.lock:
            node.seen.append(
                Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            node.peers.add(self.client_address)
        status: int = 200
        document: dict[str, Any] = {"queues": []}
        extra: dict[str, str] = {}
        if self.path == "/v1/jobs" and self.command == "POST":
            status, document = 202, {"id": json.loads(body)["id"], "status": "queued"}
        elif self.path.startswith("/moved"):
            status, document = 307, {"leader": "http://elsewhere:1"}
            extra = {"Location": "http://elsewhere:1/v1/queues"}
        elif self.path.startswith("/v1/dlq"):
            document = {"jobs": []}
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Mixed-Case", "yes")
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # 64 connections at once
    daemon_threads = True


@pytest.fixture
def node() -> Iterator[Node]:
    server = _Server(("127.0.0.1", 0), _Handler)
    running = Node(f"http://127.0.0.1:{server.server_address[1]}")
    server.node = running  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


# --- the answer -----------------------------------------------------------------------------


def test_headers_are_read_in_any_case_and_repeats_are_joined() -> None:
    headers = Headers([("Retry-After", "1"), ("X-A", "1"), ("x-a", "2")])
    assert headers["retry-after"] == headers.get("RETRY-AFTER") == "1"
    assert headers["X-A"] == "1, 2" and "x-A" in headers and len(headers) == 2
    answer = Answer.of_json(503, {"error": "unavailable"}, {"Dispatch-Leader": "http://l:1"})
    assert answer.json() == {"error": "unavailable"} and answer.headers["dispatch-leader"]
    with pytest.raises(ValueError):
        Answer(502, {}, b"<html>").json()
    assert Answer(502, {}, b"\xff<html>").text == "\ufffd<html>"


# --- failures: what may have been sent, what was refused -------------------------------------


def test_a_closed_port_is_a_refusal_that_was_never_sent() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1/queues"
    transport = SyncTransport()
    with pytest.raises(TransportError) as sync_error:
        transport.request("POST", url, headers={}, body=b"{}", timeout_s=5)
    transport.close()

    async def scenario() -> TransportError:
        transport = AsyncTransport()
        try:
            await transport.request("POST", url, headers={}, body=b"{}", timeout_s=5)
        except TransportError as error:
            return error
        finally:
            await transport.aclose()
        raise AssertionError("no error")

    for error in (sync_error.value, asyncio.run(scenario())):
        assert (error.kind, error.may_have_been_sent, error.refused) == (
            "ConnectError",
            False,
            True,
        )
        assert "refused" in str(error).lower()


def test_a_node_that_does_not_answer_is_a_read_timeout_that_may_have_been_sent(
    silent_port: int,
) -> None:
    url = f"http://127.0.0.1:{silent_port}/v1/queues"
    transport = SyncTransport()
    with pytest.raises(TransportError) as sync_error:
        transport.request("GET", url, headers={}, body=None, timeout_s=0.2)
    transport.close()

    async def scenario() -> TransportError:
        transport = AsyncTransport()
        try:
            await transport.request("GET", url, headers={}, body=None, timeout_s=0.2)
        except TransportError as error:
            return error
        finally:
            await transport.aclose()
        raise AssertionError("no error")

    for error in (sync_error.value, asyncio.run(scenario())):
        assert (error.kind, error.may_have_been_sent, error.refused) == ("ReadTimeout", True, False)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_fail_fast_says_connection_refused_with_either_transport(kind: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    if kind == "sync":
        with Client(url, "key", fail_fast=True) as client, pytest.raises(Unreachable) as raised:
            client.get("x")
    else:

        async def scenario() -> None:
            async with AsyncClient(url, "key", fail_fast=True) as client:
                await client.get("x")

        with pytest.raises(Unreachable) as raised:
            asyncio.run(scenario())
    assert str(raised.value).endswith(f"no node answers at {url} (connection refused)")


# --- requests on the wire -------------------------------------------------------------------


def test_the_transports_follow_no_redirect(node: Node) -> None:
    transport = SyncTransport()
    answer = transport.request("GET", f"{node.url}/moved", headers={}, body=None, timeout_s=5)
    transport.close()
    assert answer.status == 307 and answer.headers["location"].startswith("http://elsewhere:1")

    async def scenario() -> Answer:
        transport = AsyncTransport()
        try:
            return await transport.request(
                "GET", f"{node.url}/moved", headers={}, body=None, timeout_s=5
            )
        finally:
            await transport.aclose()

    assert asyncio.run(scenario()).status == 307
    assert [seen.path for seen in node.seen] == ["/moved", "/moved"]


def test_the_sync_client_sends_its_key_json_and_query(node: Node) -> None:
    with Client(node.url, "secret") as client:
        accepted = client.submit("a.b", {"n": "é"}, id="j1")
        assert client.dlq("x y/z", limit=5) == []
    assert accepted.id == "j1" and accepted.status == "queued"
    submit, dlq = node.seen
    assert (submit.method, submit.path) == ("POST", "/v1/jobs")
    assert submit.headers["authorization"] == "Bearer secret"
    assert submit.headers["content-type"] == "application/json"
    assert json.loads(submit.body)["payload"] == {"n": "é"}
    assert (dlq.method, dlq.path, dlq.body) == ("GET", "/v1/dlq?limit=5&exec=x%20y%2Fz", b"")
    assert "content-type" not in dlq.headers


def test_one_client_shared_by_16_threads(node: Node) -> None:
    # Each call its own request (no gathering of submits): the pool under 16 threads.
    with (
        Client(node.url, "key", max_submits_in_flight=None) as client,
        ThreadPoolExecutor(16) as pool,
    ):
        ids = list(pool.map(lambda n: client.submit("a.b", n, id=f"j{n}").id, range(320)))
    assert ids == [f"j{n}" for n in range(320)]
    assert len(node.seen) == 320
    assert len(node.peers) <= 16  # one connection per thread at most, reused


def _session(transport: AsyncTransport) -> aiohttp.ClientSession | None:
    return transport._session


def _closed(session: aiohttp.ClientSession) -> bool:
    return session.closed


def test_an_async_client_runs_64_calls_at_once(node: Node) -> None:
    async def scenario() -> list[str]:
        # Each call its own request (no gathering of submits): 64 at once on the session.
        async with AsyncClient(node.url, "key", max_submits_in_flight=None) as client:
            transport = client._transport
            assert isinstance(transport, AsyncTransport) and _session(transport) is None
            accepted = await asyncio.gather(
                *(client.submit("a.b", n, id=f"j{n}") for n in range(256))
            )
            session = _session(transport)  # made inside the loop, on the first call
            assert session is not None and not session.closed
        assert _session(transport) is None and _closed(session)  # by `aclose`
        return [answer.id for answer in accepted]

    assert asyncio.run(scenario()) == [f"j{n}" for n in range(256)]
    assert len(node.seen) == 256
    assert {seen.headers["authorization"] for seen in node.seen} == {"Bearer key"}

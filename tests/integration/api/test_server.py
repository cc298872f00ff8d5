"""A real node run the way `dispatch serve` runs it (`dispatch.api.server.uvicorn_config`):
oversized headers and WebSocket messages are refused without disturbing anything else, and no key
sent in a query string reaches a log."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from dispatch.api.memory_log import MemoryLog
from dispatch.api.server import MAX_HEADER_BYTES, ws_max_size
from dispatch.settings import Settings
from tests.integration.api.conftest import RunningNode, start_node, stop_node

pytestmark = pytest.mark.integration


@pytest.fixture
def served(api_settings: Settings) -> Iterator[RunningNode]:
    # Access logs at info, as `dispatch serve` writes them (the key-scrubbing test reads them).
    running, server, thread = start_node(api_settings, log_level="info", io=MemoryLog(api_settings))
    try:
        yield running
    finally:
        stop_node(server, thread)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _epoch(node: RunningNode) -> int:
    with node.client("admin") as admin:
        epoch: int = admin.get("/v1/leader").json()["epoch"]
        return epoch


def test_a_huge_authorization_header_is_refused_with_431(served: RunningNode) -> None:
    for size in (MAX_HEADER_BYTES + 1, 1024 * 1024):
        answer = httpx.get(
            f"{served.url}/v1/queues", headers={"Authorization": "Bearer " + "k" * size}
        )
        assert answer.status_code == 431, answer.text
    # Headers under the limit are read as usual.
    with served.client("admin") as admin:
        answer = admin.get("/v1/queues", headers={"X-Padding": "p" * (MAX_HEADER_BYTES // 2)})
        assert answer.status_code == 200, answer.text


def test_a_head_that_never_ends_is_refused_before_it_is_all_read(served: RunningNode) -> None:
    with socket.create_connection(("127.0.0.1", int(served.url.rsplit(":", 1)[1]))) as raw:
        raw.sendall(b"GET /v1/queues HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        for _ in range(8):  # 64 KiB of one header, and never its end
            raw.sendall(b"e" * 8192)
        raw.settimeout(10)
        assert raw.recv(1024).startswith(b"HTTP/1.1 431 ")


def test_an_oversized_websocket_message_closes_that_socket_only(served: RunningNode) -> None:
    epoch = _epoch(served)
    url = served.url.replace("http://", "ws://") + "/v1/stream"
    headers = {"Authorization": f"Bearer {served.keys['worker']}"}
    hello = {"type": "hello", "role": "worker", "worker_id": "big", "subjects": ["job.>"]}
    with connect(url, additional_headers=headers, proxy=None, max_size=None) as worker:
        worker.send(json.dumps(hello))
        assert json.loads(worker.recv(timeout=15))["type"] == "welcome"
        ack = {"type": "ack", "id": "x", "attempt": 1, "lease": "l", "result": "r" * (4 << 20)}
        with pytest.raises(ConnectionClosed) as closed:
            worker.send(json.dumps(ack))
            worker.recv(timeout=15)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    # The term goes on: the same leader, the same epoch, serving sockets and requests.
    with connect(url, additional_headers=headers, proxy=None) as again:
        again.send(json.dumps({**hello, "worker_id": "after"}))
        assert json.loads(again.recv(timeout=15))["type"] == "welcome"
    # A message as large as an HTTP body may be is still read (and answered).
    with connect(url, additional_headers=headers, proxy=None) as large:
        padding = "p" * (ws_max_size(served.settings) - 1024)
        large.send(json.dumps({**hello, "worker_id": "large", "padding": padding}))
        assert json.loads(large.recv(timeout=15))["type"] in ("welcome", "error")
    with served.client("admin") as admin:
        assert admin.post("/v1/jobs", json={"id": "still", "exec": "a.b"}).status_code == 202
    assert httpx.get(f"{served.url}/readyz").status_code == 200
    assert _epoch(served) == epoch


def test_no_query_value_reaches_the_logs(served: RunningNode) -> None:
    lines = _Lines()
    loggers = [logging.getLogger(name) for name in ("uvicorn.access", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(lines)
    try:
        secret = served.keys["client"]
        httpx.get(f"{served.url}/v1/queues?key={secret}&wait=1")
        url = served.url.replace("http://", "ws://") + f"/v1/stream?key={secret}"
        with connect(url, proxy=None) as socket_:
            socket_.send(json.dumps({"type": "hello", "role": "client"}))
            socket_.recv(timeout=15)
        deadline = time.monotonic() + 5
        while not any("/v1/stream" in line for line in lines.lines):
            assert time.monotonic() < deadline, lines.lines
            time.sleep(0.05)
    finally:
        for logger in loggers:
            logger.removeHandler(lines)
    assert any("/v1/queues?key=***&wait=***" in line for line in lines.lines), lines.lines
    assert not any(secret in line for line in lines.lines), lines.lines

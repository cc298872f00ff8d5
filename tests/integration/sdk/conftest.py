"""Fixtures of the SDK tests: the API tests' real node on the session's real broker, a
307-answering redirector in front of it, and workers run in a thread of the test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import uvicorn

from dispatch.api.app import create_app
from dispatch.api.memory_log import MemoryLog
from dispatch.api.node import Node
from dispatch.auth import KeyRing, ensure_dev_keys
from dispatch.client import Client, Job, NotFound
from dispatch.settings import Settings
from dispatch.worker.sdk import WorkerApp
from tests.integration.api.conftest import RunningNode, _ThreadServer, api_node, api_settings

__all__ = [
    "NodeServer",
    "Redirector",
    "api_node",
    "api_settings",
    "running_worker",
    "visible",
    "wait_until",
]


class Redirector:
    """A real HTTP server on loopback that answers every request with `307` to the same
    path on `leader`, as a follower does (Location header and `{"leader": url}` body)."""

    def __init__(self, leader: str) -> None:
        self.leader = leader
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # websockets refuses an HTTP/1.0 answer

            def _redirect(self) -> None:
                outer.hits += 1
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                body = json.dumps({"leader": outer.leader}).encode()
                self.send_response(307)
                self.send_header("Location", outer.leader + self.path)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _redirect

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the tests assert on `hits`

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Redirector:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def redirector(api_node: RunningNode) -> Iterator[Redirector]:
    with Redirector(api_node.url) as running:
        yield running


class NodeServer:
    """A real API node on a given port that can be stopped and started again (`start_node`
    picks a new free port each time; a restart test needs the same address twice)."""

    def __init__(self, settings: Settings, port: int, *, io: MemoryLog | None = None) -> None:
        self.settings = settings
        self.port = port
        self.io = io
        """The log every start of the node uses (None: the session's broker)."""
        self.url = f"http://127.0.0.1:{port}"
        self.keys = ensure_dev_keys(settings.auth)
        self._server: _ThreadServer | None = None
        self._thread: threading.Thread | None = None
        self.running: RunningNode | None = None

    def start(self) -> RunningNode:
        node = Node(self.settings, f"test-{self.port}", self.url, io=self.io)
        app = create_app(self.settings, node, KeyRing.load(self.settings.auth.keys_file))
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", ws="websockets-sansio"
        )
        server = self._server = _ThreadServer(config)
        self._thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
        self._thread.start()
        self.running = RunningNode(self.settings, node, self.url, self.keys, self.io)
        wait_until(lambda: _ready(self.url), timeout_s=60, what="the node to be ready")
        return self.running

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(30)
            assert not self._thread.is_alive(), "the node did not stop"
        self._server = self._thread = None


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def visible(client: Client, job_id: str, timeout_s: float = 20.0) -> Job:
    """The job once the leader has consumed it (a 202 means Kafka has it, a moment before)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.get(job_id)
        except NotFound:
            assert time.monotonic() < deadline, f"job {job_id} never became visible"
            time.sleep(0.05)


def wait_until(check: Callable[[], bool], timeout_s: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        time.sleep(0.05)


@contextlib.contextmanager
def running_worker(
    app: WorkerApp, node: RunningNode, *, grace_s: float = 5.0, **options: Any
) -> Iterator[str]:
    """Run `app` against `node` in a thread until the block ends; yields the worker id once
    the leader knows the worker. Fast keep-alives: the test node forgets a worker after 3 s."""
    worker_id = options.pop("worker_id", f"test-{app.name}-{time.monotonic_ns()}")
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            app.run(
                handle_signals=False, urls=node.url, api_key=node.keys["worker"],
                worker_id=worker_id, keepalive_s=options.pop("keepalive_s", 1.0),
                grace_s=grace_s, **options,
            )  # fmt: skip
        except BaseException as error:  # noqa: BLE001  (re-raised in the test's thread)
            failure.append(error)

    thread = threading.Thread(target=serve, name=f"worker-{worker_id}")
    thread.start()
    try:
        with Client(node.url, node.keys["admin"]) as admin:
            wait_until(
                lambda: (
                    bool(failure)
                    or any(worker.worker_id == worker_id for worker in admin.workers())
                ),
                what=f"worker {worker_id} to join",
            )
        if failure:
            raise failure[0]
        yield worker_id
    finally:
        app.stop()
        thread.join(60)
        assert not thread.is_alive(), "the worker did not stop"
    if failure:
        raise failure[0]

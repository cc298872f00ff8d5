"""A real API node per test: uvicorn on a free loopback port, in this process, electing itself
through the lease table on disk. Its log is the in-memory twin (`dispatch.api.memory_log.MemoryLog`)
for the tests of the API's behaviour (`api_node`), and the session's real Kafka broker with the
test's own topics for those of what only a broker shows (`broker_api_node`, `start_node` with
no `io`)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from kafka import KafkaConsumer
from websockets.sync.client import ClientConnection, connect

from dispatch.api.app import create_app
from dispatch.api.leader_io import NodeIO
from dispatch.api.memory_log import MemoryLog
from dispatch.api.node import Node
from dispatch.api.server import uvicorn_config
from dispatch.auth import KeyRing, ensure_dev_keys
from dispatch.settings import Settings
from dispatch.stack.ports import free_port
from dispatch.submit_records import Rejection


@dataclass
class RunningNode:
    settings: Settings
    node: Node
    url: str
    keys: dict[str, str]
    memory: MemoryLog | None = None
    """The node's log when it is the in-memory twin (None: the session's broker)."""

    def client(self, role: str = "admin", timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.keys[role]}"},
            timeout=timeout,
        )

    def wait_known(self, job_id: str, timeout_s: float = 20.0) -> None:
        """Until the leader consumed the job's record (a repeat is then answered as
        existing, and the job can be read)."""
        deadline = time.monotonic() + timeout_s
        with self.client("admin") as admin:
            while admin.get(f"/v1/jobs/{job_id}").status_code != 200:
                assert time.monotonic() < deadline, f"{job_id} was never enqueued"
                time.sleep(0.1)

    def submitted_keys(self) -> list[bytes]:
        """Every key in the submit topic, read to its end."""
        if self.memory is not None:
            return self.memory.submitted_keys()
        consumer = KafkaConsumer(
            self.settings.kafka.submit_topic,
            bootstrap_servers=self.settings.kafka.bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=3_000,
        )
        try:
            return [record.key for record in consumer]
        finally:
            consumer.close()

    def rejections(self, count: int) -> list[Rejection]:
        """The first `count` rejection records of the rejected topic (committed ones)."""
        if self.memory is not None:
            deadline = time.monotonic() + 20
            while len(self.memory.rejected) < count and time.monotonic() < deadline:
                time.sleep(0.05)
            return [Rejection.from_record_value(raw) for raw in self.memory.rejected[:count]]
        consumer = KafkaConsumer(
            self.settings.kafka.rejected_topic,
            bootstrap_servers=self.settings.kafka.bootstrap,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            consumer_timeout_ms=20_000,
        )
        found: list[Rejection] = []
        try:
            for record in consumer:
                found.append(Rejection.from_record_value(record.value))
                if len(found) == count:
                    break
        finally:
            consumer.close()
        return found


class _ThreadServer(uvicorn.Server):
    def install_signal_handlers(self) -> None:
        # Signals belong to pytest's main thread.
        pass


def start_node(
    settings: Settings,
    *,
    log_level: str = "warning",
    wait_ready: bool = True,
    io: NodeIO | None = None,
) -> tuple[RunningNode, _ThreadServer, threading.Thread]:
    """A node in this process, run as `dispatch serve` runs it, on `io` (default: Kafka);
    returned once `/readyz` is 200 (it leads), or, without `wait_ready`, once it answers at
    all (a follower)."""
    port = free_port()
    keys = ensure_dev_keys(settings.auth)
    node = Node(settings, f"test-{port}", f"http://127.0.0.1:{port}", io=io)
    app = create_app(settings, node, KeyRing.load(settings.auth.keys_file))
    # The production limits (header and WebSocket message sizes, log scrubbing).
    server = _ThreadServer(uvicorn_config(app, settings, "127.0.0.1", port, log_level=log_level))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    memory = io if isinstance(io, MemoryLog) else None
    running = RunningNode(settings, node, f"http://127.0.0.1:{port}", keys, memory)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(f"{running.url}/readyz", timeout=2)
            if answer.status_code == 200 or not wait_ready:
                return running, server, thread
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.should_exit = True
    thread.join(15)
    raise RuntimeError("the API node did not become ready within 60 s")


def stop_node(server: _ThreadServer, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(30)


def short_timeouts(topics: Settings) -> Settings:
    """Per-test settings with short timeouts, so retries show within a test, and keys of the
    test's own."""
    auth = topics.auth.model_copy(
        update={
            "keys_file": topics.paths.var / "api-keys.json",
            "dev_keys_file": topics.paths.var / "dev-keys.json",
        }
    )
    dispatcher = topics.dispatcher.model_copy(
        update={
            "ack_timeout_s": 1.0,
            "max_ack_timeout_s": 4.0,
            "max_attempts": 3,
            "worker_expiry_s": 3.0,
        }
    )
    return topics.model_copy(update={"auth": auth, "dispatcher": dispatcher})


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    """The test's settings with short timeouts (no topics: for a node on the in-memory log)."""
    return short_timeouts(settings)


@pytest.fixture
def broker_api_settings(topics: Settings) -> Settings:
    """The test's settings with short timeouts and its own topics in the session's broker."""
    return short_timeouts(topics)


@pytest.fixture
def api_node(api_settings: Settings) -> Iterator[RunningNode]:
    """A leading node whose log is the in-memory twin."""
    running, server, thread = start_node(api_settings, io=MemoryLog(api_settings))
    try:
        yield running
    finally:
        stop_node(server, thread)


@pytest.fixture
def broker_api_node(broker_api_settings: Settings) -> Iterator[RunningNode]:
    """A leading node on the session's Kafka broker."""
    running, server, thread = start_node(broker_api_settings)
    try:
        yield running
    finally:
        stop_node(server, thread)


def poll(
    worker: httpx.Client,
    worker_id: str,
    subjects: list[str],
    credits: int = 1,
    wait_s: float = 10.0,
) -> list[dict[str, object]]:
    answer = worker.post(
        f"/v1/workers/{worker_id}/poll",
        json={"subjects": subjects, "credits": credits, "wait_s": wait_s},
    )
    assert answer.status_code == 200, answer.text
    assignments: list[dict[str, object]] = answer.json()["assignments"]
    return assignments


def poll_until(
    worker: httpx.Client, worker_id: str, subjects: list[str], count: int, timeout_s: float = 30.0
) -> list[dict[str, object]]:
    """Poll until `count` assignments arrived (or fail after `timeout_s`)."""
    got: list[dict[str, object]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"got {len(got)} of {count} assignments"
        got += poll(worker, worker_id, subjects, credits=count - len(got), wait_s=2.0)
    return got


def stream_socket(node: RunningNode, role: str) -> ClientConnection:
    """A `WS /v1/stream` connection to `node` with the development key of `role`."""
    url = node.url.replace("http://", "ws://") + "/v1/stream"
    return connect(
        url, additional_headers={"Authorization": f"Bearer {node.keys[role]}"}, proxy=None
    )


def receive(socket: ClientConnection, kind: str, timeout: float = 15.0) -> dict[str, Any]:
    """The next message of type `kind` on `socket` (others are skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        message: dict[str, Any] = json.loads(
            socket.recv(timeout=max(0.01, deadline - time.monotonic()))
        )
        if message["type"] == kind:
            return message

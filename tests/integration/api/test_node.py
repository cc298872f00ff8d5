"""A node whose broker dies: ready means working. With a broker of this test's own (the
session's broker stays up for the other tests): `kill -9` it, and `/readyz` turns 503 within
the loop's stall bound; start it again, and the node serves at once (the term survives an
idle outage) and work resumes."""

from __future__ import annotations

import gc
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dispatch.api.leader import stall_bound_s
from dispatch.settings import Settings, load_settings
from dispatch.stack.broker import Broker, create_topics
from dispatch.stack.ports import free_port
from tests.integration.api.conftest import poll_until, short_timeouts, start_node

pytestmark = pytest.mark.integration


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Broker]:
    settings = load_settings(
        paths={"var": str(tmp_path / "var"), "warehouse": str(tmp_path / "var" / "delta")},
        kafka={"bootstrap": f"127.0.0.1:{free_port()}", "controller_port": free_port()},
    )
    broker = Broker(settings)
    broker.start()
    try:
        create_topics(settings.kafka)
        yield broker
    finally:
        broker.stop()  # by the pid this test started


def kill_9(broker: Broker) -> None:
    record = broker.running()
    assert record is not None
    os.kill(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    # Reaped (exit_code polls it), so no zombie outlives the test.
    while broker.running() is not None or broker.process.exit_code() is None:
        assert time.monotonic() < deadline, "the broker survived SIGKILL"
        time.sleep(0.05)


def wait_status(url: str, status: int, timeout_s: float) -> float:
    """Seconds until `/readyz` answered `status`."""
    started = time.monotonic()
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == status:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        assert time.monotonic() - started < timeout_s, f"/readyz never answered {status}"
        time.sleep(0.1)


# kafka-python 3.0.12 leaves the socket of every refused connection to the garbage collector
# (see `dispatch.stack.broker.Broker.wait_ready`): while the broker is down, the node's
# clients retry every `RECONNECT_BACKOFF_MAX_MS`.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_readyz_turns_503_when_the_broker_dies_and_work_resumes_when_it_is_back(
    own_broker: Broker,
) -> None:
    settings: Settings = short_timeouts(own_broker.settings)
    running, server, thread = start_node(settings)
    bound = stall_bound_s(settings)
    try:
        with running.client("client") as client, running.client("worker") as worker:
            kill_9(own_broker)
            assert wait_status(running.url, 503, timeout_s=bound + 5) <= bound + 5
            reason = httpx.get(f"{running.url}/readyz", timeout=2).json()
            assert reason["ready"] is False
            assert "broker" in (running.node.not_ready_reason() or "")

            own_broker.start()
            # The broker answers: the same term serves again (no rebuild), well within 2 s
            # on an idle machine; the bound here allows for a loaded one.
            wait_status(running.url, 200, timeout_s=30)
            answer = client.post("/v1/jobs", json={"id": "after-restart", "exec": "a.b"})
            assert answer.status_code == 202, answer.text
            assigned = poll_until(worker, "w1", ["job.assign.>"], 1)
            assert [job["id"] for job in assigned] == ["after-restart"]
    finally:
        server.should_exit = True
        thread.join(30)
        # The leaked sockets are collected here, under this test's warning filters, not at
        # the end of the session.
        gc.collect()

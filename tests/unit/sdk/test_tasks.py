"""Task handles: `@app.handler` returns the function's handle, which is still the function
and submits jobs of its exec. The requests are checked on the wire (an httpx mock node);
against a real node: tests/integration/sdk/test_tasks.py."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dispatch.client import AsyncClient, Client
from dispatch.worker import Submitted, Task, WorkerApp
from dispatch.worker.jobs import Assignment
from dispatch.worker.tasks import AsyncSubmitted, default_client, set_default_client
from tests.unit.sdk.httpx_transport import AsyncHttpxTransport, HttpxTransport


def _job(payload: Any = None, exec_name: str = "image.resize") -> Assignment:
    return Assignment(
        id="j1", exec=exec_name, payload=payload, attempt=1, deadline=time.time() + 30,
        lease="l", worker_id="w",
    )  # fmt: skip


class MockNode:
    """Answers submissions with 202 (and a warning when told), reads with a finished job."""

    def __init__(self, warning: str | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.reads: list[str] = []
        self.warning = warning

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            body = json.loads(request.content)
            self.bodies.append(body)
            return httpx.Response(
                202, json={"id": body["id"], "status": "queued", "warning": self.warning}
            )
        job_id = request.url.path.rsplit("/", 1)[-1]
        self.reads.append(job_id)
        return httpx.Response(200, json=_finished(job_id))

    def client(self) -> Client:
        client = Client("http://node:8000", "k", retry_timeout_s=1.0)
        client._transport = HttpxTransport(httpx.MockTransport(self))
        return client

    def async_client(self) -> AsyncClient:
        client = AsyncClient("http://node:8000", "k", retry_timeout_s=1.0)
        client._transport = AsyncHttpxTransport(httpx.MockTransport(self))
        return client


def _finished(job_id: str) -> dict[str, Any]:
    return {
        "id": job_id, "client_id": "c", "exec": "image.resize", "payload": None,
        "status": "succeeded", "attempts": 1, "max_attempts": 3, "timeout_s": 30.0,
        "submitted_at": 1.0, "updated_at": 2.0, "result": {"w": 10},
    }  # fmt: skip


@pytest.fixture
def node() -> Iterator[MockNode]:
    """A mock node, also the default client's, restored after the test."""
    mock = MockNode()
    client = mock.client()
    previous = set_default_client(client)
    yield mock
    set_default_client(previous)
    client.close()


app = WorkerApp("unit")


@app.handler("image.resize")
def resize(job: Assignment) -> dict[str, int]:
    """Resize an image."""
    return {"w": job.payload["w"] // 2}


@app.handler("report.*")
async def report(job: Assignment) -> str:
    return f"report {job.exec}"


def test_the_handle_is_still_the_function() -> None:
    assert isinstance(resize, Task)
    assert resize(_job({"w": 10})) == {"w": 5}
    assert resize.__name__ == "resize" and resize.__doc__ == "Resize an image."
    assert asyncio.run(report(_job(exec_name="report.daily"))) == "report report.daily"


def test_the_worker_runs_the_function_itself_with_its_kind() -> None:
    routed = app.handlers.route("image.resize")
    assert routed is not None and routed.handler.function is resize.function
    assert not routed.handler.is_async
    routed = app.handlers.route("report.daily")
    assert routed is not None and routed.handler.is_async
    # Registered again through its handle (another app), an async task stays async.
    other = WorkerApp("other")
    other.add_handler("report.weekly", report)
    routed = other.handlers.route("report.weekly")
    assert routed is not None and routed.handler.is_async
    assert inspect.iscoroutinefunction(report.__call__)


def test_stacked_decorators_register_the_function_under_each_pattern() -> None:
    stacked = WorkerApp("stacked")

    @stacked.handler("thumb.small")
    @stacked.handler("thumb.large")
    def thumb(job: Assignment) -> str:
        return job.exec

    assert thumb.exec == "thumb.small"
    for exec_name in ("thumb.small", "thumb.large"):
        routed = stacked.handlers.route(exec_name)
        assert routed is not None and routed.handler.function is thumb.function


def test_submit_sends_the_exec_of_the_decorator_with_the_options(node: MockNode) -> None:
    accepted = resize.submit({"w": 10}, id="img-1", max_attempts=5, priority=2, delay_s=1.5)
    assert node.bodies == [
        {"exec": "image.resize", "payload": {"w": 10}, "id": "img-1", "max_attempts": 5,
         "priority": 2, "delay_s": 1.5},
    ]  # fmt: skip
    assert isinstance(accepted, Submitted)
    assert (accepted.id, accepted.status, accepted.existing, accepted.warning) == (
        "img-1", "queued", False, None,
    )  # fmt: skip


def test_an_id_is_made_before_the_first_try_when_none_is_given(node: MockNode) -> None:
    first, second = resize.submit({"w": 1}), resize.submit({"w": 2})
    assert first.id != second.id and [body["id"] for body in node.bodies] == [first.id, second.id]


def test_the_answer_waits_through_the_client_that_submitted(node: MockNode) -> None:
    mine = MockNode()
    with mine.client() as client:
        accepted = resize.submit({"w": 10}, client=client)
        job = accepted.wait(timeout_s=5)
    assert job.status == "succeeded" and job.result == {"w": 10}
    assert mine.reads == [accepted.id]
    assert node.bodies == [] and node.reads == []  # the default client was not used


def test_the_servers_warning_reaches_the_caller(node: MockNode) -> None:
    node.warning = "no worker serves exec 'image.resize' now: the job waits until one does"
    assert resize.submit({"w": 1}).warning == node.warning


def test_a_wildcard_task_needs_an_exec_it_matches(node: MockNode) -> None:
    assert report.exec is None
    with pytest.raises(ValueError, match=r"pass exec=, e.g. 'report.name'"):
        report.submit({"day": 1})
    with pytest.raises(ValueError, match=r"not one task 'report\.\*' serves"):
        report.submit({"day": 1}, exec="image.crop")
    with pytest.raises(ValueError, match="wildcards are not allowed"):
        report.submit({"day": 1}, exec="report.*")
    assert node.bodies == []  # refused before anything was sent
    report.submit({"day": 1}, exec="report.daily")
    assert [body["exec"] for body in node.bodies] == ["report.daily"]


def test_submit_async_uses_the_given_client_and_waits_through_it() -> None:
    mock = MockNode()

    async def scenario() -> tuple[AsyncSubmitted, str]:
        async with mock.async_client() as client:
            accepted = await resize.submit_async({"w": 4}, client=client, timeout_s=9.0)
            job = await accepted.wait(timeout_s=5)
        return accepted, job.status

    accepted, status = asyncio.run(scenario())
    assert isinstance(accepted, AsyncSubmitted) and status == "succeeded"
    assert mock.bodies == [
        {"exec": "image.resize", "payload": {"w": 4}, "id": accepted.id, "timeout_s": 9.0,
         "priority": 0, "delay_s": 0.0}
    ]  # fmt: skip
    assert mock.reads == [accepted.id]


def test_the_default_client_comes_from_the_environment_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISPATCH_URL", "http://n1:9000,http://n2:9001")
    monkeypatch.setenv("DISPATCH_API_KEY", "env-key")
    previous = set_default_client(None)
    try:
        client = default_client()
        assert client.router.urls == ["http://n1:9000", "http://n2:9001"]
        assert client.headers["Authorization"] == "Bearer env-key"
        assert default_client() is client  # built once, then shared
    finally:
        set_default_client(previous)
        client.close()


def test_a_task_submits_with_the_time_limit_and_the_other_job_options(node: MockNode) -> None:
    resize.submit({"w": 1}, id="img-2", max_run_s=120, ttl_s=60, retry={"delay_s": 2})
    assert node.bodies == [
        {"exec": "image.resize", "payload": {"w": 1}, "id": "img-2", "max_run_s": 120,
         "ttl_s": 60, "retry": {"delay_s": 2}, "priority": 0, "delay_s": 0.0},
    ]  # fmt: skip

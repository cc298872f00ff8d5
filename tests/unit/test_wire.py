"""The wire contract (`dispatch.wire`): the SDKs read exactly what the server sends.

The server side is the real one: the API's routers (`dispatch.api.routes`) with their response
models, on a node whose leader is replaced by a synchronous stand-in around a real core and
a real `Hub`; the SDK side is the real `AsyncClient` (over an ASGI transport), its
`ResultStream` and the worker's transports. A job is taken through every status, and what
each side holds is compared field by field with the core's record.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import orjson
import pytest
from fastapi import FastAPI
from hypothesis import given
from hypothesis import strategies as st

from dispatch import fast_json
from dispatch.api import errors
from dispatch.api.finished_ids import FinishedIds
from dispatch.api.hub import Hub
from dispatch.api.loop_commands import LoopCommand
from dispatch.api.metrics import Metrics
from dispatch.api.routes import admin, jobs, workers
from dispatch.api.routes.stream import assign_many_messages
from dispatch.auth import Principal, Role
from dispatch.client import TERMINAL_STATUSES, AsyncClient, Backoff, Job, ResultStream
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Event
from dispatch.core.job import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    DeadReason,
    JobRecord,
    JobStatus,
    check_record,
)
from dispatch.wire import (
    Accepted,
    Assignment,
    Assignments,
    JobView,
    assignment_of,
    job_view_of,
)
from dispatch.worker.jobs import Assignment as WorkerAssignment
from dispatch.worker.transports import WebSocketTransport
from tests.unit.core.helpers import T0, make
from tests.unit.sdk.httpx_transport import AsyncHttpxTransport

CLIENT = Principal("tests", Role.ADMIN, "tests")
"""The caller of every request: an admin, so the DLQ is readable too."""


# --- the server: the API's routes on a stand-in for the leader -------------------------------


class _NoArchive:
    """Delta, empty: no job finished before the leader's window."""

    def find_jobs(self, group: str, ids: Sequence[str]) -> dict[str, JobRecord]:
        return {}


class _Term:
    def __init__(self, core: Dispatcher) -> None:
        self.core = core
        self.group = "default"
        self.archive = _NoArchive()
        self.finished_ids = FinishedIds(86_400.0, 1 << 16)
        self.finished_ids.rebuild(lambda: iter(()))


class _Keyring:
    def identify(self, key: str) -> Principal:
        return CLIENT


T = TypeVar("T")


@dataclass(frozen=True)
class _Submit(LoopCommand[None]):
    """What the leader does with submissions it consumed."""

    submissions: list[Any]

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        return core.submit_many(self.submissions, now)

    def answer(self, core: Dispatcher, events: list[Event]) -> None:
        return None


@dataclass(frozen=True)
class _JoinWithCredit(LoopCommand[None]):
    worker_id: str
    subjects: list[str]
    credits: int

    def decide(self, core: Dispatcher, now: float) -> list[Event]:
        joined = core.join(self.worker_id, self.subjects, now)
        return [*joined, *core.grant_credit(self.worker_id, self.credits, now)]

    def answer(self, core: Dispatcher, events: list[Event]) -> None:
        return None


class _Node:
    """What the routes use of `dispatch.api.node.Node`, with the leader loop done in line: each
    command is decided on the core, "committed" (handed to the hub, as the loop does after a
    Kafka commit) and answered. The clock moves one second per command."""

    def __init__(self, core: Dispatcher, hub: Hub) -> None:
        self.hub = hub
        self.now = T0
        self._term = _Term(core)

    def leader(self) -> _Term:
        return self._term

    async def call(self, command: LoopCommand[T]) -> T:
        core = self._term.core
        self.now += 1.0
        events = command.decide(core, self.now)
        self.hub.committed(core, events)
        # The hub delivers with `call_soon_threadsafe`: let it run before anyone reads.
        await asyncio.sleep(0)
        return command.answer(core, events)

    async def produce_submissions(self, submissions: list[Any]) -> None:
        # The leader consumes `dispatch.submit` a moment later; here at once.
        await self.call(_Submit(submissions))


def _server(node: _Node) -> FastAPI:
    app = FastAPI()
    app.state.node = node
    app.state.keyring = _Keyring()
    errors.install(app)
    for router in (jobs.router, workers.router, admin.router):
        app.include_router(router)
    return app


@asynccontextmanager
async def _sdk(app: FastAPI) -> AsyncIterator[AsyncClient]:
    client = AsyncClient("http://node.test", api_key="key", backoff=Backoff(max_s=0.1))
    # The SDK's transport, pointed at the app in this process (no sockets).
    await client._transport.aclose()
    client._transport = AsyncHttpxTransport(httpx.ASGITransport(app=app))
    async with client:
        yield client


class _Runtime:
    """The worker runtime as a transport sees it, keeping what it is handed, read as
    `dispatch.worker.sdk` reads it."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.subjects = ["job.assign.>"]
        self.keepalive_s = 5.0
        self.received: list[WorkerAssignment] = []

    @property
    def free_slots(self) -> int:
        return 1

    @property
    def stopping(self) -> bool:
        return False

    def accept(self, message: Mapping[str, Any]) -> None:
        self.received.append(WorkerAssignment.from_message(message, self.worker_id))

    def refused(self, job_id: str, code: str, attempt: int | None = None) -> None:
        raise AssertionError(f"refused {job_id}: {code}")

    def stop_attempt(self, job_id: str, attempt: int | None, reason: str) -> None:
        raise AssertionError(f"told to stop {job_id}: {reason}")

    def held(self) -> list[WorkerAssignment]:
        return []


class _Socket:
    """The client end of `WS /v1/stream`, holding the text frames the node sent."""

    def __init__(self, frames: list[str]) -> None:
        self.frames = frames

    async def recv(self) -> str:
        return self.frames.pop(0)

    async def close(self) -> None:
        self.frames.clear()


def _sent_json(message: dict[str, Any]) -> str:
    """A message as `WebSocket.send_json` (Starlette) puts it on the wire."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


# --- comparisons ------------------------------------------------------------------------------


def _expected_view(record: JobRecord) -> dict[str, Any]:
    """What a client must read for `record`, from the record's attributes."""
    return {
        "id": record.id,
        "client_id": record.client_id,
        "exec": record.exec,
        "payload": record.payload,
        # A queued job that has run before waits for its next attempt: the API says so.
        "status": "retrying"
        if record.status is JobStatus.QUEUED and record.attempts > 0
        else "cancelling"
        if record.cancel_requested_at is not None
        else record.status.value,
        "attempts": record.attempts,
        "max_attempts": record.max_attempts,
        "timeout_s": record.timeout_s,
        "priority": record.priority,
        "not_before": record.not_before,
        "worker_id": record.worker_id,
        "deadline": record.deadline,
        "submitted_at": record.submitted_at,
        "updated_at": record.updated_at,
        "result": record.result,
        "error": record.error,
        "dead_reason": None if record.dead_reason is None else record.dead_reason.value,
        "next_attempt_at": record.not_before
        if record.status is JobStatus.QUEUED and record.attempts > 0
        else None,
        "expires_at": record.expires_at,
        "max_run_s": record.max_run_s,
        "run_limit_at": record.run_limit_at,
        "cancel_requested_at": record.cancel_requested_at,
        "progress": record.progress,
        "key": record.key,
    }


def _assert_same_job(read: Job, record: JobRecord) -> None:
    expected = _expected_view(record)
    assert set(expected) == set(JobView.model_fields), "a JobView field this test does not know"
    for name, value in expected.items():
        assert getattr(read, name) == value, f"{record.id}.{name}"
    assert read.terminal == record.is_terminal


def _assert_same_assignment(read: WorkerAssignment, record: JobRecord, worker_id: str) -> None:
    expected = {
        "id": record.id,
        "exec": record.exec,
        "payload": record.payload,
        "attempt": record.attempts,
        "deadline": record.deadline,
        "lease": record.lease,
    }
    assert set(expected) == set(Assignment.model_fields)
    for name, value in expected.items():
        assert getattr(read, name) == value, f"{record.id}.{name}"
    assert read.worker_id == worker_id


def _assert_sent_in_full(sent: Mapping[str, Any], model: type[JobView | Assignment]) -> None:
    """The server sent every field of the shape and nothing the shape does not name (an
    SDK ignores unknown fields: a renamed one would pass unseen)."""
    assert set(sent) - {"type"} == set(model.model_fields)


# --- the round trip through every status ----------------------------------------------------


def _record(core: Dispatcher, job_id: str) -> JobRecord:
    record = core.job(job_id)
    assert record is not None
    return record


async def _every_status() -> None:
    """Drive jobs through every status over the real routes and SDKs, comparing each read
    with the core's record."""
    core = make()
    hub = Hub(asyncio.get_running_loop(), Metrics())
    node = _Node(core, hub)
    app = _server(node)
    finished = hub.subscribe(CLIENT.client_id)
    payload = {"rows": [1, 2.5, None], "name": "é", "nested": {"ok": True}}
    async with _sdk(app) as client:
        accepted = await client.submit("later.job", payload, id="queued", priority=5, delay_s=60)
        assert accepted == Accepted(id="queued", status="queued", existing=False)
        batch = await client.submit_many(
            [
                {"exec": "work.ok", "id": "succeeded", "payload": payload},
                {"exec": "work.fail", "id": "dead", "max_attempts": 3},
                {"exec": "work.retry", "id": "running", "max_attempts": 3, "timeout_s": 7.5},
                {"exec": "later.job", "id": "cancelled"},
            ]
        )
        assert [(a.id, a.status, a.existing) for a in batch] == [
            (job_id, "queued", False) for job_id in ("succeeded", "dead", "running", "cancelled")
        ]
        again = await client.submit("later.job", id="queued")
        assert again == Accepted(id="queued", status="queued", existing=True)
        cancelled = await client.cancel("cancelled")
        _assert_same_job(cancelled, _record(core, "cancelled"))

        # A worker polls (REST) and receives three assignments.
        polled = await client.poll("w1", ["job.assign.work.>"], credits=3, wait_s=0)
        for message in polled:
            _assert_sent_in_full(message, Assignment)
        received = {job.id: job for job in (WorkerAssignment.from_message(m, "w1") for m in polled)}
        assert set(received) == {"succeeded", "dead", "running"}
        for job_id, assignment in received.items():
            _assert_same_assignment(assignment, _record(core, job_id), "w1")
        first = received["running"]
        running_before = await client.get("running")
        _assert_same_job(running_before, _record(core, "running"))
        assert running_before.status == "running" and running_before.deadline is not None

        ok, dead = received["succeeded"], received["dead"]
        assert await client.ack(ok.id, ok.attempt, ok.lease, {"bytes": 3, "list": [1.5]}) == (
            "succeeded"
        )
        await client.fail(dead.id, dead.attempt, dead.lease, "bad input", retryable=False)
        await client.fail(first.id, first.attempt, first.lease, "db busy", retryable=True)

        # A second worker, on the WebSocket, takes the retry: attempt 2.
        await node.call(_JoinWithCredit("w2", ["job.assign.work.retry"], 1))
        taken = hub.take("w2")
        frames = [
            *assign_many_messages(taken),
            fast_json.dumps_text({"type": "assign", **taken[0]}),
        ]
        runtime = _Runtime("w2")
        transport = WebSocketTransport(client, runtime, Backoff())
        for frame in frames:
            message = orjson.loads(frame)
            for sent in message.get("assignments", [message]):
                _assert_sent_in_full(sent, Assignment)
            transport._on_message(message)
        assert len(runtime.received) == 2 and runtime.received[0] == runtime.received[1]
        _assert_same_assignment(runtime.received[0], _record(core, "running"), "w2")
        assert runtime.received[0].attempt == 2

        # Each job, read over REST, is its record; so is the DLQ.
        statuses = {}
        for job_id in ("queued", "running", "succeeded", "dead", "cancelled"):
            raw = (
                await client._transport.request(
                    "GET", f"http://node.test/v1/jobs/{job_id}", headers=client.headers,
                    body=None, timeout_s=10.0,
                )
            ).json()  # fmt: skip
            _assert_sent_in_full(raw, JobView)
            job = await client.get(job_id)
            _assert_same_job(job, _record(core, job_id))
            statuses[job_id] = job
        assert {job_id: job.status for job_id, job in statuses.items()} == {
            job_id: job_id for job_id in statuses
        }
        assert statuses["queued"].not_before is not None and statuses["queued"].priority == 5
        assert statuses["running"].attempts == 2 and statuses["running"].error == "db busy"
        assert statuses["running"].worker_id == "w2" and statuses["running"].timeout_s == 7.5
        assert statuses["succeeded"].result == {"bytes": 3, "list": [1.5]}
        assert statuses["succeeded"].payload == payload
        assert statuses["dead"].error == "bad input"
        assert statuses["dead"].dead_reason == DeadReason.PERMANENT_FAILURE.value
        assert {job_id for job_id, job in statuses.items() if job.terminal} == {
            "succeeded",
            "dead",
            "cancelled",
        }
        [listed] = await client.dlq()
        _assert_same_job(listed, _record(core, "dead"))

        # The results a client's stream was pushed: the three jobs that ended.
        pushed: list[str] = []
        while not finished.empty():
            message = finished.get_nowait()
            _assert_sent_in_full(message, JobView)
            pushed.append(_sent_json(message))
        stream = ResultStream(client)
        stream._socket = _Socket(pushed)  # type: ignore[assignment]
        results = [await stream.__anext__() for _ in range(len(pushed))]
        await stream.aclose()
        assert sorted(job.id for job in results) == ["cancelled", "dead", "succeeded"]
        for job in results:
            _assert_same_job(job, _record(core, job.id))


def test_the_sdks_read_what_the_server_sends_in_every_status() -> None:
    asyncio.run(_every_status())


def test_a_field_the_server_renames_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def renamed(job: JobRecord) -> dict[str, Any]:
        view = job_view_of(job)
        view["dead_cause"] = view.pop("dead_reason")
        return view

    monkeypatch.setattr("dispatch.api.hub.job_view_of", renamed)
    # The response model fills the missing field with its default; the SDK reads None.
    with pytest.raises(AssertionError, match=r"dead\.dead_reason"):
        asyncio.run(_every_status())


def test_the_sdk_re_exports_the_cores_terminal_statuses() -> None:
    assert {str(status) for status in JobStatus if status in TERMINAL_STATUSES} == {
        "succeeded",
        "dead",
        "cancelled",
        "expired",
    }
    assert all(type(status) is str for status in TERMINAL_STATUSES)


def test_the_published_schemas_say_every_field_is_sent() -> None:
    # The defaults of JobView and Assignment serve readers only; the OpenAPI document (in
    # FastAPI's serialization mode) names every field as required, as before they were shared.
    for model in (JobView, Assignment):
        schema = model.model_json_schema(mode="serialization")
        assert schema["required"] == list(model.model_fields)
    assert "lease" not in JobView.model_fields  # a worker's secret, never shown to clients


def test_an_assignment_is_encoded_only_for_a_running_job() -> None:
    record = JobRecord(
        id="j", client_id="c", exec="a.b", payload=None, max_attempts=1, timeout_s=1.0,
        submitted_at=T0, updated_at=T0, seq=0,
    )  # fmt: skip
    with pytest.raises(ValueError, match="only a running job"):
        assignment_of(record)


# --- the same, for any record ---------------------------------------------------------------

_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
_JSON: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | _INT64 | _FLOATS | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_IDS = st.text(alphabet="abcdefghij-_.0123456789", min_size=1, max_size=12)
_TIMES = st.floats(min_value=0, max_value=4e9, allow_nan=False)


_PROGRESS = st.fixed_dictionaries(
    {
        "done": st.floats(min_value=0, max_value=1e6),
        "total": st.none() | st.floats(min_value=0, max_value=1e6),
        "message": st.none() | st.text(max_size=20),
        "at": _TIMES,
    }
)


_KEYS = st.text(alphabet="abc:0123456789-/ ", min_size=1, max_size=12)


@st.composite
def _records(draw: st.DrawFn, status: JobStatus | None = None) -> JobRecord:
    status = draw(st.sampled_from(JobStatus)) if status is None else status
    max_attempts = draw(st.integers(1, 20))
    low = 1 if status is JobStatus.RUNNING else 0
    high = max_attempts - 1 if status is JobStatus.QUEUED else max_attempts
    running = status is JobStatus.RUNNING
    queued = status is JobStatus.QUEUED
    record = JobRecord(
        id=draw(_IDS),
        client_id=draw(_IDS),
        exec=draw(st.sampled_from(["a", "image.resize", "x.y.z"])),
        payload=draw(_JSON),
        max_attempts=max_attempts,
        timeout_s=draw(st.floats(min_value=0.001, max_value=1e6)),
        submitted_at=draw(_TIMES),
        updated_at=draw(_TIMES),
        seq=draw(st.integers(-1000, 1000)),
        status=status,
        attempts=draw(st.integers(low, high)),
        priority=draw(st.integers(PRIORITY_MIN, PRIORITY_MAX)),
        not_before=draw(st.none() | _TIMES),
        worker_id=None if queued else draw(_IDS if running else st.none() | _IDS),
        lease=draw(_IDS) if running else draw(st.none() | _IDS),
        deadline=draw(_TIMES) if running else None,
        result=draw(_JSON),
        error=draw(st.none() | st.text(max_size=20)),
        dead_reason=draw(st.sampled_from(DeadReason)) if status is JobStatus.DEAD else None,
        expires_at=draw(st.none() | _TIMES),
        max_run_s=draw(st.none() | st.floats(min_value=0.001, max_value=1e6)),
        run_limit_at=draw(st.none() | _TIMES) if running else None,
        cancel_requested_at=draw(st.none() | _TIMES) if running else None,
        progress=draw(st.none() | _PROGRESS),
        key=draw(st.none() | _KEYS),
    )
    check_record(record)
    return record


@given(_records())
def test_any_job_view_reads_back_as_its_record(record: JobRecord) -> None:
    sent = job_view_of(record)
    _assert_sent_in_full(sent, JobView)
    # As FastAPI answers it (validated by the response model, dumped by pydantic) and as the
    # hub pushes it (`send_json`).
    for wire_bytes in (
        JobView.model_validate(sent).model_dump_json(),
        _sent_json({"type": "result", **sent}),
    ):
        _assert_same_job(Job.model_validate_json(wire_bytes), record)


@given(_records(JobStatus.RUNNING))
def test_any_assignment_reads_back_as_its_record(record: JobRecord) -> None:
    sent = assignment_of(record)
    _assert_sent_in_full(sent, Assignment)
    for wire_bytes in (
        Assignments.model_validate({"assignments": [sent]}).model_dump_json(),
        assign_many_messages([sent])[0],
    ):
        [message] = orjson.loads(wire_bytes)["assignments"]
        _assert_same_assignment(WorkerAssignment.from_message(message, "w"), record, "w")

"""The worker runtime's stop of an attempt (a cancel, a time limit, an attempt no longer the
worker's), on a fake transport: what the handler sees and how the attempt is settled. The
transports' part (which messages and answers stop an attempt) is checked on fake runtimes."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
import pytest

from dispatch.client import AsyncClient, Backoff, Conflict, NotFound
from dispatch.worker.jobs import Assignment, JobCancelled, Outcome, stopped
from dispatch.worker.sdk import WorkerApp, _Runtime
from dispatch.worker.transports import RestTransport, WebSocketTransport
from tests.unit.sdk.httpx_transport import AsyncHttpxTransport


class FakeTransport:
    """Records settlements and heartbeats (with their progress reports and when they were
    sent); `beat` answers (or raises for) each heartbeat."""

    def __init__(self) -> None:
        self.settled: list[tuple[str, int, Outcome]] = []
        self.beats: list[str] = []
        self.reports: list[tuple[float, Mapping[str, Any] | None]] = []
        self.freed = 0
        self.beat: Callable[[Assignment], float | None] = lambda held: None
        self.closed = asyncio.Event()

    async def run(self) -> None:
        await self.closed.wait()

    async def stop_taking(self) -> None:
        pass

    async def settle(self, held: Assignment, outcome: Outcome) -> None:
        self.settled.append((held.id, held.attempt, outcome))

    async def heartbeat(
        self, held: Assignment, progress: Mapping[str, Any] | None = None
    ) -> float | None:
        self.beats.append(held.id)
        self.reports.append((time.monotonic(), progress))
        return self.beat(held)

    async def slot_freed(self) -> None:
        self.freed += 1

    async def close(self, drain_s: float) -> None:
        self.closed.set()


def _message(job_id: str = "j1", attempt: int = 1, deadline_in_s: float = 30.0) -> dict[str, Any]:
    return {"id": job_id, "exec": "t.run", "payload": None, "attempt": attempt,
            "deadline": time.time() + deadline_in_s, "lease": "L"}  # fmt: skip


def _runtime(
    handler: Callable[[Assignment], Any], *, heartbeat: bool = True
) -> tuple[_Runtime, FakeTransport]:
    app = WorkerApp("unit", concurrency=2)
    app.add_handler("t.*", handler, heartbeat=heartbeat)
    client = AsyncClient("http://node:1", "k")
    runtime = _Runtime(app.handlers, app.options(worker_id="w1"), client)
    fake = FakeTransport()
    runtime.transport = fake
    return runtime, fake


async def _until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 20))


def test_the_stop_flag_is_no_part_of_an_assignments_value() -> None:
    job = Assignment.from_message(_message(), "w1")
    same = Assignment.from_message({**_message(), "deadline": job.deadline}, "w1")
    assert (job.cancelled, job.cancel_reason, job.wait_cancelled(0)) == (False, None, False)
    job.raise_if_cancelled()  # not told: nothing
    assert job.request_cancel("time_limit") and not job.request_cancel("ended")
    assert (job.cancelled, job.cancel_reason, job.wait_cancelled(0)) == (True, "time_limit", True)
    with pytest.raises(JobCancelled, match="cancelled: time_limit") as raised:
        job.raise_if_cancelled()
    assert raised.value.reason == "time_limit"
    assert job == same and job.model_dump() == same.model_dump()
    assert "cancel" not in job.model_dump_json()
    assert not job.model_copy(deep=True).cancelled and job.model_copy().cancelled


def test_a_stopped_async_handler_is_cancelled_and_its_attempt_fails_for_good() -> None:
    seen: list[tuple[bool, str | None]] = []
    started = asyncio.Event()

    async def forever(job: Assignment) -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append((job.cancelled, job.cancel_reason))
            raise
        return "never"

    async def scenario() -> None:
        runtime, fake = _runtime(forever)
        runtime.accept(_message())
        await started.wait()
        assert runtime.free_slots == 1
        runtime.stop_attempt("j1", 1, "cancel_requested")
        await _until(lambda: bool(fake.settled))
        assert fake.settled == [("j1", 1, stopped("cancel_requested"))]
        assert fake.settled[0][2] == Outcome(
            "fail", error="cancelled: cancel_requested", retryable=False
        )
        assert seen == [(True, "cancel_requested")]
        await _until(lambda: fake.freed == 1)
        assert runtime.free_slots == 2 and runtime.held() == []

    _run(scenario)


def test_a_sync_handler_sees_the_flag_and_its_attempt_is_settled_cancelled() -> None:
    checks: list[int] = []

    def loop(job: Assignment) -> str:
        while not job.wait_cancelled(0.01):
            checks.append(1)
        assert job.cancel_reason == "time_limit"
        job.raise_if_cancelled()
        return "unreachable"

    async def scenario() -> None:
        runtime, fake = _runtime(loop)
        runtime.accept(_message())
        await _until(lambda: len(checks) > 2)
        runtime.stop_attempt("j1", None, "time_limit")  # None: whichever attempt it runs
        await _until(lambda: bool(fake.settled))
        assert fake.settled == [("j1", 1, stopped("time_limit"))]
        await _until(lambda: runtime.free_slots == 2)

    _run(scenario)


def test_a_sync_handler_that_ignores_the_flag_still_acks() -> None:
    release = threading.Event()

    def stubborn(job: Assignment) -> dict[str, bool]:
        release.wait(5)
        return {"cancelled": job.cancelled}

    async def scenario() -> None:
        runtime, fake = _runtime(stubborn)
        runtime.accept(_message())
        await asyncio.sleep(0.05)
        runtime.stop_attempt("j1", 1, "cancel_requested")
        await asyncio.sleep(0.05)
        assert fake.settled == [] and runtime.free_slots == 1, "the slot waits for the thread"
        release.set()
        await _until(lambda: bool(fake.settled))
        # The leader decides: an ack of a cancel-requested attempt completes the job.
        assert fake.settled == [("j1", 1, Outcome("ack", result={"cancelled": True}))]

    _run(scenario)


def test_only_the_named_attempt_stops_and_a_second_stop_changes_nothing() -> None:
    release = asyncio.Event()

    async def waits(job: Assignment) -> int:
        await release.wait()
        return job.attempt

    async def scenario() -> None:
        runtime, fake = _runtime(waits)
        runtime.accept(_message("j1", attempt=2))
        runtime.accept(_message("j2", attempt=1))
        await asyncio.sleep(0.02)
        runtime.stop_attempt("j1", 1, "cancel_requested")  # an older attempt: not this one
        runtime.stop_attempt("nope", 1, "cancel_requested")
        await asyncio.sleep(0.02)
        assert fake.settled == []
        runtime.stop_attempt("j1", 2, "ended")
        runtime.stop_attempt("j1", 2, "cancel_requested")  # the first reason stays
        await _until(lambda: len(fake.settled) == 1)
        assert fake.settled == [("j1", 2, stopped("ended"))]
        release.set()
        await _until(lambda: len(fake.settled) == 2)
        assert fake.settled[1] == ("j2", 1, Outcome("ack", result=1))

    _run(scenario)


@pytest.mark.parametrize("refusal", [Conflict("stale", error="stale_lease"), NotFound("gone")])
def test_a_refused_heartbeat_stops_the_attempt_as_ended(refusal: Exception) -> None:
    async def forever(job: Assignment) -> None:
        await asyncio.sleep(60)

    def refuse(held: Assignment) -> float | None:
        raise refusal

    async def scenario() -> None:
        runtime, fake = _runtime(forever)
        fake.beat = refuse
        runtime.accept(_message(deadline_in_s=0.3))  # first heartbeat after 0.1 s
        await _until(lambda: bool(fake.settled))
        assert fake.beats == ["j1"]
        assert fake.settled == [("j1", 1, stopped("ended"))]

    _run(scenario)


def test_a_settlement_refused_as_not_ours_stops_the_attempt() -> None:
    async def forever(job: Assignment) -> None:
        await asyncio.sleep(60)

    async def scenario() -> None:
        runtime, fake = _runtime(forever)
        runtime.accept(_message())
        await asyncio.sleep(0.02)
        runtime.refused("j1", "invalid")  # not a "no longer yours": runs on
        await asyncio.sleep(0.02)
        assert fake.settled == []
        runtime.refused("j1", "stale_lease")
        await _until(lambda: bool(fake.settled))
        assert fake.settled == [("j1", 1, stopped("ended"))]

    _run(scenario)


def test_a_worker_stop_still_releases_what_was_not_told_to_stop() -> None:
    async def forever(job: Assignment) -> None:
        await asyncio.sleep(60)

    async def scenario() -> None:
        runtime, fake = _runtime(forever)
        runtime._grace_s = 0.0
        serving = asyncio.create_task(runtime.serve())
        await asyncio.sleep(0.01)
        runtime.accept(_message("kept"))
        runtime.accept(_message("told"))
        await asyncio.sleep(0.02)
        runtime.stop_attempt("told", 1, "cancel_requested")
        await _until(lambda: len(fake.settled) == 1)
        runtime.request_stop(0)
        await serving
        outcomes = {job_id: outcome for job_id, _, outcome in fake.settled}
        assert outcomes["told"] == stopped("cancel_requested")
        assert outcomes["kept"].retryable and "stopped before" in outcomes["kept"].error

    _run(scenario)


# --- the transports --------------------------------------------------------------------------


class FakeRuntime:
    worker_id = "w1"
    keepalive_s = 1.0
    free_slots = 1
    stopping = False

    def __init__(self) -> None:
        self.subjects = ["job.assign.t.*"]
        self.stops: list[tuple[str, int | None, str]] = []
        self.accepted: list[dict[str, Any]] = []
        self.refusals: list[tuple[str, str]] = []

    def accept(self, message: Mapping[str, Any]) -> None:
        self.accepted.append(dict(message))

    def refused(self, job_id: str, code: str, attempt: int | None = None) -> None:
        self.refusals.append((job_id, code))

    def held(self) -> list[Assignment]:
        return [Assignment.from_message(_message(), self.worker_id)]

    def stop_attempt(self, job_id: str, attempt: int | None, reason: str) -> None:
        self.stops.append((job_id, attempt, reason))


def _client(answer: Callable[[httpx.Request], httpx.Response]) -> AsyncClient:
    client = AsyncClient("http://node:1", "k", retry_timeout_s=1.0)
    client._transport = AsyncHttpxTransport(httpx.MockTransport(answer))
    return client


def test_a_socket_cancel_message_stops_the_attempt() -> None:
    async def scenario() -> None:
        runtime = FakeRuntime()
        transport = WebSocketTransport(AsyncClient("http://node:1", "k"), runtime, Backoff())
        transport._on_message({"type": "cancel", "id": "j1", "attempt": 1, "reason": "time_limit"})
        transport._on_message({"type": "cancel", "id": "j2", "attempt": 3})
        transport._on_message({"type": "cancel", "attempt": 3})  # no id: ignored
        assert runtime.stops == [("j1", 1, "time_limit"), ("j2", 3, "cancel_requested")]

    _run(scenario)


def test_a_socket_refusal_of_a_settlement_stops_nothing_but_one_of_a_heartbeat_does() -> None:
    async def scenario() -> None:
        runtime = FakeRuntime()
        transport = WebSocketTransport(AsyncClient("http://node:1", "k"), runtime, Backoff())
        held = runtime.held()[0]
        await transport.settle(held, Outcome("fail", error="cancelled: time_limit"))
        # The settled attempt ended here; a newer one of the same job may run on.
        transport._on_message({"type": "error", "error": "stale_lease", "id": held.id})
        assert runtime.refusals == [] and transport._unconfirmed == {}
        transport._on_message({"type": "error", "error": "stale_lease", "id": held.id})
        assert runtime.refusals == [(held.id, "stale_lease")]

    _run(scenario)


def test_a_refusal_naming_an_attempt_stops_only_that_one() -> None:
    release = asyncio.Event()

    async def waits(job: Assignment) -> int:
        await release.wait()
        return job.attempt

    async def scenario() -> None:
        runtime, fake = _runtime(waits)
        runtime.accept(_message("j1", attempt=1))
        runtime.accept(_message("j1", attempt=2))
        await asyncio.sleep(0.02)
        runtime.refused("j1", "stale_lease", 1)
        await _until(lambda: len(fake.settled) == 1)
        assert fake.settled == [("j1", 1, stopped("ended"))]
        release.set()
        await _until(lambda: len(fake.settled) == 2)
        assert fake.settled[1] == ("j1", 2, Outcome("ack", result=2))

    _run(scenario)


def test_a_poll_answer_and_a_heartbeat_answer_stop_attempts() -> None:
    requests: list[tuple[str, dict[str, Any]]] = []

    def node(request: httpx.Request) -> httpx.Response:
        requests.append((request.url.path, json.loads(request.content)))
        if request.url.path.endswith("/poll"):
            return httpx.Response(200, json={
                "assignments": [], "epoch": 4,
                "cancel": [{"id": "j1", "attempt": 1, "reason": "cancel_requested"}],
            })  # fmt: skip
        return httpx.Response(200, json={"deadline": 123.5, "cancel": "cancel_requested"})

    async def scenario() -> None:
        runtime = FakeRuntime()
        async with _client(node) as client:
            transport = RestTransport(client, runtime, Backoff())
            await transport.alive.poll(1, 0.0)
            assert runtime.stops == [("j1", 1, "cancel_requested")]
            assert requests[0][1]["held"] == [{"id": "j1", "attempt": 1, "lease": "L"}]
            held = runtime.held()[0]
            assert await transport.heartbeat(held) == 123.5
            assert runtime.stops[1:] == [("j1", 1, "cancel_requested")]

    _run(scenario)


def test_answers_of_an_older_server_stop_nothing() -> None:
    def node(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/poll"):
            return httpx.Response(200, json={"assignments": [], "epoch": 1})
        return httpx.Response(200, json={"deadline": 99.0})

    async def scenario() -> None:
        runtime = FakeRuntime()
        async with _client(node) as client:
            polled = await client.poll_term("w1", runtime.subjects, 1, 0.0)
            assert polled.cancel == []
            beat = await client.heartbeat_answer("j1", 1, "L", "w1")
            assert (beat.deadline, beat.cancel) == (99.0, None)
            assert await client.heartbeat("j1", 1, "L", "w1") == 99.0
            transport = RestTransport(client, runtime, Backoff())
            await transport.alive.poll(1, 0.0)
            await transport.heartbeat(runtime.held()[0])
        assert runtime.stops == []

    _run(scenario)


def test_an_attempt_told_to_stop_before_it_started_never_runs() -> None:
    ran: list[str] = []

    async def handler(job: Assignment) -> None:
        ran.append(job.id)

    async def scenario() -> None:
        runtime, fake = _runtime(handler)
        runtime.accept(_message())  # its task starts on the loop's next step
        runtime.stop_attempt("j1", 1, "cancel_requested")
        await _until(lambda: bool(fake.settled))
        assert fake.settled == [("j1", 1, stopped("cancel_requested"))] and ran == []
        await _until(lambda: runtime.free_slots == 2)

    _run(scenario)

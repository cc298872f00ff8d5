"""Progress reports in the worker SDK (`Assignment.progress`): checked where they are made,
kept thread-safely, sent with heartbeats at most one each `PROGRESS_EVERY_S`; on the wire of
both transports; and read by the client's results stream (`on_progress`)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

from dispatch.client import AsyncClient, Backoff, Job, JobProgress, ResultStream
from dispatch.worker import sdk
from dispatch.worker.jobs import Assignment
from dispatch.worker.transports import RestTransport, WebSocketTransport
from tests.unit.sdk.test_runtime import FakeRuntime, _client, _message, _run, _runtime, _until

EVERY_S = 0.2
"""PROGRESS_EVERY_S in these tests (1.05 s in a worker), to keep them short."""


@pytest.fixture(autouse=True)
def _fast_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdk, "PROGRESS_EVERY_S", EVERY_S)


def _job() -> Assignment:
    return Assignment.from_message(_message(), "w1")


def _sent(reports: list[tuple[float, Mapping[str, Any] | None]]) -> list[tuple[float, Any]]:
    return [(at, report) for at, report in reports if report is not None]


# --- the report -------------------------------------------------------------------------------


def test_a_report_is_checked_and_kept() -> None:
    assert _job().last_progress is None
    job = _job()
    job.progress(3, 10, "three of ten")
    assert job.last_progress == {"done": 3.0, "total": 10.0, "message": "three of ten"}
    job.progress(0.5)
    assert job.last_progress == {"done": 0.5, "total": None, "message": None}
    job.progress(7, message="x" * 200)  # the longest message


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((-1,), "progress.done"),
        ((True,), "progress.done"),
        (("3",), "progress.done"),
        ((math.nan,), "progress.done"),
        ((math.inf,), "progress.done"),
        ((2e15,), "progress.done"),
        ((1, -0.5), "progress.total"),
        ((1, "10"), "progress.total"),
        ((1, 10, "x" * 201), "progress.message"),
        ((1, 10, 5), "progress.message"),
    ],
)
def test_a_bad_report_is_a_value_error_naming_its_field(args: tuple[Any, ...], field: str) -> None:
    job = _job()
    job.progress(1, 2)
    with pytest.raises(ValueError, match=field):
        job.progress(*args)
    assert job.last_progress == {"done": 1.0, "total": 2.0, "message": None}, "kept the last"


def test_progress_is_no_part_of_an_assignments_value() -> None:
    job = _job()
    same = Assignment.from_message({**_message(), "deadline": job.deadline}, "w1")
    job.progress(5, 10)
    assert job == same and job.model_dump() == same.model_dump()
    assert "progress" not in job.model_dump_json()
    assert job.model_copy(deep=True).last_progress is None


def test_reports_from_many_threads_keep_one_whole_report_and_wake_the_loop_once() -> None:
    job = _job()
    woken: list[int] = []
    job._progress.listen(lambda: woken.append(1))
    start = threading.Barrier(8)

    def report(thread: int) -> None:
        start.wait()
        for n in range(500):
            job.progress(n, 500, f"thread {thread}")

    threads = [threading.Thread(target=report, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    last = job.last_progress
    assert last is not None and last["done"] == 499.0 and last["message"].startswith("thread ")
    assert woken == [1], "one wake-up for a waiting report, however many replace it"
    assert job._progress.take() == last and job._progress.take() is None
    assert job._progress.take(again=True) == last
    job.progress(1)
    assert woken == [1, 1]


# --- the report rides the heartbeat -----------------------------------------------------------


def test_the_first_report_is_sent_at_once_then_at_most_one_each_interval() -> None:
    stop = threading.Event()

    def busy(job: Assignment) -> str:  # sync: reports from its own thread
        n = 0
        while not stop.is_set():
            job.progress(n, message=f"step {n}")
            n += 1
            time.sleep(0.005)
        return "done"

    async def scenario() -> None:
        runtime, fake = _runtime(busy)
        started = time.monotonic()
        runtime.accept(_message(deadline_in_s=30))  # regular heartbeats 10 s apart
        await _until(lambda: bool(_sent(fake.reports)))
        assert _sent(fake.reports)[0][0] - started < 0.15, "the first report went at once"
        await asyncio.sleep(1.0)
        stop.set()
        await _until(lambda: bool(fake.settled))
        sent = _sent(fake.reports)
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(sent)]
        assert 4 <= len(sent) <= 7, sent
        assert min(gaps) >= EVERY_S * 0.85  # (recorded a moment after the pacer's clock)
        assert [report["done"] for _, report in sent] == sorted(r["done"] for _, r in sent)
        assert len(fake.reports) == len(sent), "no heartbeat without a report was due"

    _run(scenario)


def test_an_async_handler_reports_from_the_loop_and_the_last_report_is_sent_again() -> None:
    release = asyncio.Event()

    async def steps(job: Assignment) -> int:
        for n in range(3):
            job.progress(n + 1, 3)
            await asyncio.sleep(0.01)
        await release.wait()
        return 3

    async def scenario() -> None:
        runtime, fake = _runtime(steps)
        runtime.accept(_message(deadline_in_s=0.9))  # a heartbeat every ~0.3 s
        await _until(lambda: len(_sent(fake.reports)) >= 3, timeout_s=3)
        await asyncio.sleep(1.2)  # several more heartbeats, with no new report
        release.set()
        await _until(lambda: bool(fake.settled))
        sent = [report for _, report in _sent(fake.reports)]
        # The first at once; the last (3 of 3) after the interval; then once more, for the
        # leader may have dropped it; heartbeats go on without one.
        assert sent[0] == {"done": 1.0, "total": 3.0, "message": None}
        assert sent[1:] == [{"done": 3.0, "total": 3.0, "message": None}] * 2
        assert len(fake.reports) > len(sent)

    _run(scenario)


def test_without_regular_heartbeats_only_reports_send_one() -> None:
    proceed = threading.Event()
    finish = threading.Event()

    def quiet_then_reports(job: Assignment) -> str:
        proceed.wait(5)
        job.progress(1, 2)
        job.progress(2, 2)  # replaces the first, unless that went already
        finish.wait(5)
        return "ok"

    async def scenario() -> None:
        runtime, fake = _runtime(quiet_then_reports, heartbeat=False)
        runtime.accept(_message(deadline_in_s=0.6))  # heartbeat=True would beat every 0.2 s
        await asyncio.sleep(0.7)
        assert fake.reports == [], "no report, no heartbeat"
        proceed.set()
        await _until(lambda: bool(fake.reports))
        await asyncio.sleep(0.5)
        # The first report may go before the second replaced it; the latest goes anyway,
        # each in a heartbeat of its own, and neither again.
        done = [report["done"] for _, report in _sent(fake.reports)]
        assert done in ([2.0], [1.0, 2.0]) and len(fake.reports) == len(done)
        finish.set()
        await _until(lambda: bool(fake.settled))

    _run(scenario)


def test_a_report_whose_heartbeat_failed_is_sent_again() -> None:
    from dispatch.client import Unavailable

    failures = [Unavailable("down")]
    release = asyncio.Event()

    def flaky(held: Assignment) -> float | None:
        if failures:
            raise failures.pop()
        return None

    async def once(job: Assignment) -> None:
        job.progress(1, 1)
        await release.wait()

    async def scenario() -> None:
        runtime, fake = _runtime(once, heartbeat=False)
        fake.beat = flaky
        runtime.accept(_message(deadline_in_s=0.6))
        await _until(lambda: len(fake.reports) == 1)
        job = runtime.held()[0]
        job.progress(1, 1)  # the same again: a new report wakes the loop
        await _until(lambda: len(fake.reports) == 2)
        assert [report for _, report in fake.reports] == [{"done": 1.0, "total": 1.0,
                                                           "message": None}] * 2  # fmt: skip
        assert fake.reports[1][0] - fake.reports[0][0] >= EVERY_S - 0.01
        release.set()
        await _until(lambda: bool(fake.settled))

    _run(scenario)


# --- the wire ---------------------------------------------------------------------------------


class _Socket:
    def __init__(self, incoming: list[Any] | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.incoming = [json.dumps(message) for message in incoming or []]
        self.closed = False

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def recv(self) -> str:
        if not self.incoming:
            await asyncio.sleep(60)
        return self.incoming.pop(0)

    async def close(self) -> None:
        self.closed = True


def test_a_socket_heartbeat_carries_the_report() -> None:
    async def scenario() -> None:
        runtime = FakeRuntime()
        transport = WebSocketTransport(AsyncClient("http://node:1", "k"), runtime, Backoff())
        socket = _Socket()
        transport._socket = socket  # type: ignore[assignment]
        held = runtime.held()[0]
        await transport.heartbeat(held)
        await transport.heartbeat(held, {"done": 2.0, "total": None, "message": "m"})
        beat = {"type": "heartbeat", "id": "j1", "attempt": 1, "lease": "L"}
        assert socket.sent == [
            beat, {**beat, "progress": {"done": 2.0, "total": None, "message": "m"}},
        ]  # fmt: skip

    _run(scenario)


def test_a_rest_heartbeat_carries_the_report_in_its_body() -> None:
    bodies: list[dict[str, Any]] = []

    def node(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"id": "j1", "deadline": 50.0})

    async def scenario() -> None:
        runtime = FakeRuntime()
        async with _client(node) as client:
            transport = RestTransport(client, runtime, Backoff())
            held = runtime.held()[0]
            assert await transport.heartbeat(held, {"done": 1.0, "total": 4.0}) == 50.0
            assert await transport.heartbeat(held) == 50.0
            assert await client.heartbeat("j1", 1, "L", "w1", progress={"done": 3}) == 50.0
        base = {"attempt": 1, "lease": "L", "worker_id": "w1"}
        assert bodies == [
            {**base, "progress": {"done": 1.0, "total": 4.0}},
            base,  # no report: no field (an older server refuses it)
            {**base, "progress": {"done": 3}},
        ]

    _run(scenario)


# --- the client's results stream --------------------------------------------------------------


def _job_view(job_id: str) -> dict[str, Any]:
    return {"id": job_id, "client_id": "c", "exec": "t.run", "status": "succeeded",
            "attempts": 1, "max_attempts": 3, "timeout_s": 30.0, "submitted_at": 1.0,
            "updated_at": 2.0, "result": 7,
            "progress": {"done": 3.0, "total": 3.0, "message": None, "at": 1.5}}  # fmt: skip


def _stream(
    client: AsyncClient, messages: list[Any], on_progress: Any = None
) -> tuple[ResultStream, _Socket]:
    socket = _Socket(messages)

    async def open_stream(hello: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
        return socket, {"type": "welcome"}

    client.open_stream = open_stream  # type: ignore[method-assign]
    return client.results(on_progress=on_progress), socket


def _report(job_id: str, done: float, **extra: Any) -> dict[str, Any]:
    progress = {"done": done, "total": 3.0, "message": None, "at": 10.0 + done, **extra}
    return {"type": "progress", "id": job_id, "progress": progress}


@pytest.mark.parametrize("kind", ["function", "coroutine"])
def test_the_results_stream_hands_progress_reports_to_a_callback(kind: str) -> None:
    seen: list[JobProgress] = []

    def record(report: JobProgress) -> None:
        seen.append(report)

    async def record_async(report: JobProgress) -> None:
        await asyncio.sleep(0)
        seen.append(report)

    messages = [
        _report("a", 1.0, message="one"),
        {"type": "progress", "id": "a", "progress": {"total": 3}},  # no `done`: skipped
        {"type": "progress", "id": "a"},  # no report: skipped
        _report("a", 2.0),
        {**_job_view("a"), "type": "result"},
    ]

    async def scenario() -> None:
        async with AsyncClient("http://node:1", "k") as client:
            callback = record if kind == "function" else record_async
            stream, _ = _stream(client, messages, callback)
            async with stream:
                job = await stream.__anext__()
        assert isinstance(job, Job) and job.result == 7
        assert job.progress == {"done": 3.0, "total": 3.0, "message": None, "at": 1.5}
        assert seen == [
            JobProgress(id="a", done=1.0, total=3.0, message="one", at=11.0),
            JobProgress(id="a", done=2.0, total=3.0, message=None, at=12.0),
        ]

    _run(scenario)


def test_without_a_callback_the_results_stream_skips_progress_reports() -> None:
    async def scenario() -> None:
        async with AsyncClient("http://node:1", "k") as client:
            stream, _ = _stream(client, [_report("a", 1.0), {**_job_view("a"), "type": "result"}])
            async with stream:
                job = await stream.__anext__()
        assert job.id == "a"

    _run(scenario)

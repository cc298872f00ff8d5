"""The worker SDK against a real node and the real broker, over both transports: jobs run
end to end, `Retry` retries, `PermanentError` dead-letters, heartbeats keep a slow job past
its ack timeout, an idle worker stays known, a stop lets running jobs finish or releases them.

The test node runs with a 1 s first ack timeout and forgets a silent worker after 3 s."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import httpx
import pytest

from dispatch.api.memory_log import MemoryLog
from dispatch.client import AsyncClient, Client
from dispatch.settings import Settings
from dispatch.stack.ports import free_port
from dispatch.worker import Assignment, PermanentError, Retry, WorkerApp, WorkerError
from tests.integration.api.conftest import RunningNode
from tests.integration.sdk.conftest import NodeServer, running_worker, visible, wait_until

pytestmark = pytest.mark.integration

TRANSPORTS = ["ws", "rest"]


def _admin(node: RunningNode) -> Client:
    return Client(node.url, node.keys["admin"])


def _app(concurrency: int = 2) -> WorkerApp:
    app = WorkerApp("sdk", concurrency=concurrency)
    running: list[int] = []
    peak: list[int] = [0]
    lock = threading.Lock()

    @app.handler("sdk.add")
    def add(job: Assignment) -> int:  # sync: runs in a thread
        with lock:
            running.append(1)
            peak[0] = max(peak[0], len(running))
        time.sleep(0.2)
        with lock:
            running.pop()
        return int(job.payload["a"]) + int(job.payload["b"])

    @app.handler("sdk.*")
    async def echo(job: Assignment) -> dict[str, Any]:  # async: on the worker's loop
        await asyncio.sleep(0)
        return {"exec": job.exec, "payload": job.payload, "attempt": job.attempt}

    @app.handler("sdk.flaky")
    def flaky(job: Assignment) -> str:
        if job.attempt < 2:
            raise Retry("not yet")
        return f"ok on attempt {job.attempt}"

    @app.handler("sdk.broken")
    def broken(job: Assignment) -> None:
        raise PermanentError("cannot ever work")

    @app.handler("sdk.crash")
    def crash(job: Assignment) -> None:
        raise RuntimeError("unexpected")

    started: set[str] = set()

    @app.handler("sdk.slow")
    async def slow(job: Assignment) -> str:
        started.add(job.id)
        await asyncio.sleep(float(job.payload))
        return "slow but done"

    app.peak = peak  # type: ignore[attr-defined]
    # The slow jobs the worker itself began: "running" on the leader is not enough to stop
    # it mid-job, since the assignment may still be on its way to the worker (a REST poll's
    # answer), and one that arrives while the worker stops is released, not run.
    app.started = started  # type: ignore[attr-defined]
    return app


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_jobs_run_end_to_end_with_retries_and_dead_letters(
    api_node: RunningNode, transport: str
) -> None:
    app = _app(concurrency=2)
    with _admin(api_node) as admin, running_worker(app, api_node, transport=transport):
        admin.submit_many(
            [{"exec": "sdk.add", "payload": {"a": n, "b": 1}, "id": f"add{n}"} for n in range(4)]
            + [{"exec": "sdk.echo", "payload": [1, "x"], "id": "echo"}]
            + [{"exec": "sdk.flaky", "id": "flaky"}]
            + [{"exec": "sdk.broken", "id": "broken"}]
            + [{"exec": "sdk.crash", "id": "crash", "max_attempts": 2}]
        )
        for n in range(4):
            job = admin.wait(f"add{n}", timeout_s=30)
            assert (job.status, job.result, job.attempts) == ("succeeded", n + 1, 1)
        echo = admin.wait("echo", timeout_s=30)
        assert echo.result == {"exec": "sdk.echo", "payload": [1, "x"], "attempt": 1}

        flaky = admin.wait("flaky", timeout_s=30)
        assert (flaky.status, flaky.result, flaky.attempts) == (
            "succeeded", "ok on attempt 2", 2,
        )  # fmt: skip
        broken = admin.wait("broken", timeout_s=30)
        assert (broken.status, broken.dead_reason, broken.error, broken.attempts) == (
            "dead", "permanent_failure", "cannot ever work", 1,
        )  # fmt: skip
        crash = admin.wait("crash", timeout_s=30)
        assert (crash.status, crash.dead_reason, crash.attempts) == (
            "dead", "retries_exhausted", 2,
        )  # fmt: skip
        assert crash.error == "RuntimeError: unexpected"
        assert app.peak[0] == 2  # type: ignore[attr-defined]  # concurrency used, not exceeded


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_heartbeats_keep_a_slow_job_past_its_ack_timeout(
    api_node: RunningNode, transport: str
) -> None:
    app = _app(concurrency=1)
    with _admin(api_node) as admin, running_worker(app, api_node, transport=transport):
        # The first ack timeout is 1 s: without heartbeats this job would be taken away.
        admin.submit("sdk.slow", 2.5, id="slow")
        job = admin.wait("slow", timeout_s=30)
        assert (job.status, job.attempts, job.result) == ("succeeded", 1, "slow but done")


def test_without_heartbeats_a_slow_job_times_out(api_node: RunningNode) -> None:
    app = WorkerApp("stall", concurrency=1)

    @app.handler("sdk.stall", heartbeat=False)
    async def stall(job: Assignment) -> str:
        await asyncio.sleep(1.6)
        return f"attempt {job.attempt}"

    with _admin(api_node) as admin, running_worker(app, api_node):
        admin.submit("sdk.stall", id="stall", max_attempts=3)
        job = admin.wait("stall", timeout_s=30)
        # Attempt 1 (1 s) times out; attempt 2 has 2 s and finishes in 1.6 s.
        assert (job.status, job.attempts, job.result) == ("succeeded", 2, "attempt 2")


def test_an_idle_socket_worker_stays_known_past_the_worker_expiry(api_node: RunningNode) -> None:
    app = _app()
    with _admin(api_node) as admin, running_worker(app, api_node) as worker_id:
        time.sleep(4.0)  # the node forgets a worker silent for 3 s
        assert worker_id in [worker.worker_id for worker in admin.workers()]
        admin.submit("sdk.echo", "late", id="late")
        assert admin.wait("late", timeout_s=10).status == "succeeded"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stop_finishes_running_jobs_within_the_grace_period(
    api_node: RunningNode, transport: str
) -> None:
    app = _app(concurrency=1)
    with _admin(api_node) as admin:
        with running_worker(app, api_node, transport=transport, grace_s=10):
            admin.submit("sdk.slow", 1.5, id="finishing")
            wait_until(lambda: "finishing" in app.started)  # type: ignore[attr-defined]
        # The block's end stopped the worker: it waited for the job.
        job = admin.get("finishing")
        assert (job.status, job.attempts) == ("succeeded", 1)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stop_releases_jobs_that_outlast_the_grace_period(
    api_node: RunningNode, transport: str
) -> None:
    app = _app(concurrency=1)
    with _admin(api_node) as admin:
        with running_worker(app, api_node, transport=transport, grace_s=0.3):
            admin.submit("sdk.slow", 30, id="released")
            wait_until(lambda: visible(admin, "released").status == "running")
            started = time.monotonic()
        assert time.monotonic() - started < 5
        job = admin.get("released")
        # Requeued at once (no retry delay) as a retryable failure, not left to its deadline.
        assert (job.status, job.attempts, job.next_attempt_at) == ("retrying", 1, None)
        assert job.error is not None and "stopped before the job finished" in job.error


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_worker_reconnects_when_its_node_restarts(
    api_settings: Settings, transport: str
) -> None:
    # The log outlives the node, as Kafka does: the restarted node rebuilds from it.
    server = NodeServer(api_settings, free_port(), io=MemoryLog(api_settings))
    node = server.start()
    try:
        with _admin(node) as admin, running_worker(_app(), node, transport=transport):
            admin.submit("sdk.echo", 1, id="before")
            assert admin.wait("before", timeout_s=10).status == "succeeded"
            server.stop()
            server.start()
            # The new node rebuilt the state from the log; the worker found it again.
            admin.submit("sdk.echo", 2, id="after")
            after = admin.wait("after", timeout_s=30)
            assert (after.status, after.result["payload"]) == ("succeeded", 2)
    finally:
        server.stop()


def test_misconfigured_apps_fail_at_start(api_node: RunningNode) -> None:
    with pytest.raises(WorkerError, match="no handlers"):
        WorkerApp("empty").options()
    app = _app()
    with pytest.raises(WorkerError, match=r"job\.assign\.other\.\* are not covered"):
        app.options(subjects=["job.assign.other.*"])
    with pytest.raises(WorkerError, match="subject pattern such as"):
        app.options(subjects=["sdk.*"])
    # A key without the worker role is refused by the node at hello: a fatal error.
    with pytest.raises(Exception, match="forbidden"):
        app.run(handle_signals=False, urls=api_node.url, api_key=api_node.keys["client"])


def test_a_socket_worker_moves_on_when_the_term_ends(api_node: RunningNode) -> None:
    app = _app(concurrency=1)
    with _admin(api_node) as admin, running_worker(app, api_node, transport="ws"):
        admin.submit("sdk.echo", 1, id="first")
        assert admin.wait("first", timeout_s=10).status == "succeeded"
        leader = api_node.node._leader
        assert leader is not None
        leader.stop()  # its sockets close with 1013; the node leads again in a new term
        wait_until(lambda: api_node.node._leader not in (None, leader), what="a new term")
        admin.submit("sdk.echo", 2, id="second")
        # If the new term assigned it before the worker was back, the worker's hello
        # requeued that undelivered attempt: it succeeds on attempt 2.
        second = admin.wait("second", timeout_s=30)
        assert second.status == "succeeded" and second.attempts <= 2


def test_a_socket_worker_takes_a_job_whose_payload_is_at_the_size_limit(
    api_node: RunningNode,
) -> None:
    # The assignment wraps the payload in an envelope: with a payload just under the node's
    # limit it is larger than 1 MiB, websockets' default limit on what a client reads.
    app = WorkerApp("sdk-big")

    @app.handler("sdk.size")
    def size(job: Assignment) -> int:
        return len(job.payload)

    limit = api_node.settings.api.max_payload_bytes
    payload = "x" * (limit - 100)
    with _admin(api_node) as admin, running_worker(app, api_node, transport="ws"):
        admin.submit("sdk.size", payload, id="big-payload")
        job = admin.wait("big-payload", timeout_s=30)
        assert (job.status, job.result, job.attempts) == ("succeeded", len(payload), 1)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_handler_s_retry_delay_holds_the_next_attempt_back(
    api_node: RunningNode, transport: str
) -> None:
    """`Retry(delay_s=...)` travels as the failure's `retry_after_s` (WebSocket and REST): the
    client sees the job `retrying` with its next attempt, which starts no sooner."""
    app = WorkerApp("sdk", concurrency=1)
    started: list[float] = []

    @app.handler("sdk.later")
    def later(job: Assignment) -> str:
        started.append(time.time())
        if job.attempt == 1:
            raise Retry("the database is down", delay_s=1.5)
        return "done"

    with _admin(api_node) as admin, running_worker(app, api_node, transport=transport):
        admin.submit("sdk.later", id="later")
        seen: list[Any] = []

        def retrying() -> bool:
            seen.append(admin.get("later"))
            return bool(seen[-1].status == "retrying")

        wait_until(retrying)
        waiting = seen[-1]
        assert waiting.next_attempt_at is not None and waiting.error == "the database is down"
        job = admin.wait("later", timeout_s=30)
        assert (job.status, job.attempts) == ("succeeded", 2)
        assert started[1] - started[0] >= 1.4, started
        assert started[1] >= waiting.next_attempt_at - 0.05


def test_a_rest_worker_gets_back_at_once_an_assignment_lost_with_the_previous_term(
    api_settings: Settings,
) -> None:
    # Deadlines far off: without the worker saying what it holds, the lost assignment would
    # wait a minute for its deadline.
    dispatcher = api_settings.dispatcher.model_copy(
        update={"ack_timeout_s": 60.0, "max_ack_timeout_s": 60.0}
    )
    settings = api_settings.model_copy(update={"dispatcher": dispatcher})
    server = NodeServer(settings, free_port(), io=MemoryLog(settings))
    node = server.start()
    try:
        with _admin(node) as admin:
            admin.submit("sdk.echo", 1, id="lost")
            # The worker's poll is answered with the assignment, and the answer is lost with
            # the term (here: the poll's caller drops it).
            with httpx.Client(base_url=node.url, timeout=10) as raw:
                answer = raw.post(
                    "/v1/workers/w-lost/poll",
                    json={"subjects": ["job.assign.sdk.*"], "credits": 1, "wait_s": 5},
                    headers={"Authorization": f"Bearer {node.keys['worker']}"},
                )
            assert [a["id"] for a in answer.json()["assignments"]] == ["lost"]
            first_epoch = answer.json()["epoch"]
            server.stop()
            node = server.start()  # a new term, rebuilt from the log: "lost" runs on w-lost
        with _admin(node) as admin:
            assert admin.get("lost").status == "running"
            started = time.monotonic()
            with running_worker(_app(), node, transport="rest", worker_id="w-lost"):
                done = admin.wait("lost", timeout_s=20)
            assert done.status == "succeeded" and done.attempts == 2
            assert time.monotonic() - started < 20  # not the minute of its deadline
            assert node.node.leader().core.epoch > first_epoch
            # Within the term the worker's polls carry what it holds and change nothing.
            admin.submit("sdk.echo", 2, id="then")
            with running_worker(_app(), node, transport="rest", worker_id="w-lost"):
                assert admin.wait("then", timeout_s=20).attempts == 1
    finally:
        server.stop()


# --- cancelling a running job, and the time limit of an attempt -----------------------------


def _stoppable_app() -> WorkerApp:
    """`sdk.spin` (sync: checks `job.cancelled` in a loop) and `sdk.park` (async: awaits for
    ever), each recording what it saw when it stopped."""
    app = WorkerApp("sdk-stop", concurrency=1)
    started: dict[tuple[str, int], float] = {}
    stops: dict[tuple[str, int], str | None] = {}

    @app.handler("sdk.spin")
    def spin(job: Assignment) -> str:
        started[(job.id, job.attempt)] = time.monotonic()
        while not job.cancelled:
            time.sleep(0.02)  # a step of the work
        stops[(job.id, job.attempt)] = job.cancel_reason
        job.raise_if_cancelled()
        return "not reached"

    @app.handler("sdk.park")
    async def park(job: Assignment) -> str:
        started[(job.id, job.attempt)] = time.monotonic()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stops[(job.id, job.attempt)] = job.cancel_reason
            raise
        return "not reached"

    app.started = started  # type: ignore[attr-defined]
    app.stops = stops  # type: ignore[attr-defined]
    return app


@pytest.mark.parametrize("exec_name", ["sdk.spin", "sdk.park"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cancelling_a_running_job_stops_its_handler(
    api_node: RunningNode, transport: str, exec_name: str
) -> None:
    app = _stoppable_app()
    job_id = f"stop-{exec_name}-{transport}"
    with _admin(api_node) as admin, running_worker(app, api_node, transport=transport):
        admin.submit(exec_name, id=job_id)
        wait_until(lambda: (job_id, 1) in app.started)  # type: ignore[attr-defined]
        asked = time.monotonic()
        answer = admin.cancel(job_id, reason="no longer needed")
        assert answer.status == "cancelling" and answer.cancel_requested_at is not None
        job = admin.wait(job_id, timeout_s=20)
        # The worker confirmed (failed the attempt): long before the leader's cancel grace.
        assert job.status == "cancelled" and job.attempts == 1
        assert time.monotonic() - asked < 10
        assert app.stops == {(job_id, 1): "cancel_requested"}  # type: ignore[attr-defined]
        # The slot was freed: the worker (concurrency 1) takes the next job.
        admin.submit("sdk.park", id=f"{job_id}-next")
        wait_until(lambda: (f"{job_id}-next", 1) in app.started)  # type: ignore[attr-defined]
        assert admin.cancel(f"{job_id}-next").status == "cancelling"
        assert admin.wait(f"{job_id}-next", timeout_s=20).status == "cancelled"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_attempt_past_its_max_run_s_is_stopped_and_retried_then_dead(
    api_node: RunningNode, transport: str
) -> None:
    app = _stoppable_app()
    job_id = f"limited-{transport}"
    with _admin(api_node) as admin, running_worker(app, api_node, transport=transport):
        # Heartbeats would keep it for ever; max_run_s does not let them.
        admin.submit("sdk.park", id=job_id, max_run_s=1.5, max_attempts=2,
                      retry={"delay_s": 0.2, "jitter": 0})  # fmt: skip
        job = admin.wait(job_id, timeout_s=30)
        assert (job.status, job.dead_reason, job.attempts, job.max_run_s) == (
            "dead", "time_limit", 2, 1.5,
        )  # fmt: skip
        # Both attempts ran on this worker (one slot: the first was stopped and freed it),
        # each stopped once its time was up.
        wait_until(lambda: len(app.stops) == 2)  # type: ignore[attr-defined]
        assert set(app.stops) == {(job_id, 1), (job_id, 2)}  # type: ignore[attr-defined]
        assert set(app.stops.values()) <= {"time_limit", "ended"}  # type: ignore[attr-defined]
        ran = app.started[(job_id, 2)] - app.started[(job_id, 1)]  # type: ignore[attr-defined]
        assert ran >= 1.4, ran


def test_cancel_many_cancels_queued_and_running_jobs(api_node: RunningNode) -> None:
    app = _stoppable_app()
    with _admin(api_node) as admin, running_worker(app, api_node, transport="ws"):
        admin.submit_many([{"exec": "sdk.park", "id": f"many{n}"} for n in range(3)])
        wait_until(lambda: any(key[0].startswith("many") for key in app.started))  # type: ignore[attr-defined]
        for n in range(3):
            visible(admin, f"many{n}")
        answer = admin.cancel_many(exec="sdk.park", status="any", reason="purge")
        assert answer == {"cancelled": 2, "cancelling": 1}
        for n in range(3):
            assert admin.wait(f"many{n}", timeout_s=20).status == "cancelled"


# --- progress ---------------------------------------------------------------------------------


def _progress_app(finish: threading.Event) -> WorkerApp:
    app = WorkerApp("progress", concurrency=3)

    @app.handler("sdk.count")
    def count(job: Assignment) -> int:  # sync: reports from its thread
        n = 0
        while not finish.is_set() and not job.cancelled:
            n += 1
            job.progress(n, message=f"step {n}")
            time.sleep(0.05)
        return n

    @app.handler("sdk.count_async")
    async def count_async(job: Assignment) -> int:  # async: reports from the loop
        n = 0
        while not finish.is_set():
            n += 1
            job.progress(n, 10_000)
            await asyncio.sleep(0.05)
        return n

    @app.handler("sdk.count_quiet", heartbeat=False)
    def count_quiet(job: Assignment) -> int:  # only its reports keep it past its timeout
        n = 0
        while not finish.is_set() and not job.cancelled:
            n += 1
            job.progress(n, 10_000)
            time.sleep(0.05)
        return n

    return app


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_handlers_report_progress_that_clients_read_while_the_job_runs(
    api_node: RunningNode, transport: str
) -> None:
    finish = threading.Event()
    app = _progress_app(finish)
    ids = {"sdk.count": f"count-{transport}", "sdk.count_async": f"async-{transport}",
           "sdk.count_quiet": f"quiet-{transport}"}  # fmt: skip
    seen: dict[str, list[float]] = {job_id: [] for job_id in ids.values()}
    try:
        with (
            Client(api_node.url, api_node.keys["client"]) as client,
            running_worker(app, api_node, transport=transport),
        ):
            for exec_name, job_id in ids.items():
                # Reports go at most about one a second: they keep a job whose ack timeout
                # is longer than that.
                timeout_s = 3.0 if exec_name == "sdk.count_quiet" else None
                client.submit(exec_name, id=job_id, max_attempts=1, timeout_s=timeout_s)

            def three_reports_each() -> bool:
                for job_id, done in seen.items():
                    job = client.get(job_id)
                    # Each job runs past its ack timeout on its heartbeats (the quiet one
                    # on its reports alone), showing its latest report.
                    assert job.status == "running", job
                    if job.progress is not None and (not done or job.progress["done"] > done[-1]):
                        done.append(job.progress["done"])
                return all(len(done) >= 3 for done in seen.values())

            wait_until(three_reports_each, timeout_s=30, what="three reports of each job")
            sync_job = client.get(ids["sdk.count"])
            assert sync_job.progress is not None
            assert sync_job.progress["total"] is None
            assert sync_job.progress["message"] == f"step {int(sync_job.progress['done'])}"
            assert isinstance(sync_job.progress["at"], float)
            assert client.get(ids["sdk.count_async"]).progress["total"] == 10_000  # type: ignore[index]
            finish.set()
            for job_id in ids.values():
                job = client.wait(job_id, timeout_s=30)
                assert (job.status, job.attempts) == ("succeeded", 1), job
                # Kept when the job ends: a report of this attempt, at most its result.
                assert job.progress is not None and 1 <= job.progress["done"] <= job.result
    finally:
        finish.set()
    for done in seen.values():
        assert done == sorted(done)


def test_the_results_stream_brings_progress_reports(api_node: RunningNode) -> None:
    finish = threading.Event()
    app = _progress_app(finish)
    reports: list[Any] = []

    async def watch() -> Any:
        async with (
            AsyncClient(api_node.url, api_node.keys["client"]) as client,
            client.results(on_progress=reports.append) as results,
        ):
            await client.submit("sdk.count_async", id="streamed", max_attempts=1)
            async for job in results:
                if job.id == "streamed":
                    return job
        return None

    def finish_after_reports() -> None:
        wait_until(lambda: len(reports) >= 3, timeout_s=30, what="three pushed reports")
        finish.set()

    with running_worker(app, api_node):
        stopper = threading.Thread(target=finish_after_reports)
        stopper.start()
        try:
            job = asyncio.run(asyncio.wait_for(watch(), 60))
        finally:
            finish.set()
            stopper.join(60)
    assert job is not None and job.status == "succeeded"
    assert all(report.id == "streamed" and report.total == 10_000 for report in reports)
    done = [report.done for report in reports]
    assert done == sorted(done) and len(set(done)) >= 3
    ats = [report.at for report in reports]
    assert all(b - a >= 0.99 for a, b in itertools.pairwise(ats)), "one a second"

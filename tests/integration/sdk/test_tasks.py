"""Task handles and the unserved-exec warning against a real node: a job submitted through
its handler's handle runs on a worker of that app; a submission no connected worker serves is
answered with a warning (REST, both paths of `POST /v1/jobs`, the batch, the SDK and
`dispatch submit`), and the warning follows workers as they join and leave."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from dispatch.client import AsyncClient, Client
from dispatch.worker import Assignment, WorkerApp
from dispatch.worker.tasks import set_default_client
from tests.integration.api.conftest import RunningNode, poll
from tests.integration.sdk.conftest import running_worker, wait_until

pytestmark = pytest.mark.integration

app = WorkerApp("tasks", concurrency=2)


@app.handler("tasks.double")
def double(job: Assignment) -> int:
    return 2 * int(job.payload)


@app.handler("tasks.shout.*")
async def shout(job: Assignment) -> str:
    return f"{job.exec}: {str(job.payload).upper()}"


def _warning(exec_name: str) -> str:
    return f"no worker serves exec {exec_name!r} now: the job waits until one does"


@pytest.fixture
def client_env(api_node: RunningNode, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The environment a client process has, and no default client built yet."""
    monkeypatch.setenv("DISPATCH_URL", api_node.url)
    monkeypatch.setenv("DISPATCH_API_KEY", api_node.keys["client"])
    previous = set_default_client(None)
    yield
    built = set_default_client(previous)
    if built is not None:
        built.close()


def test_a_job_submitted_through_its_handle_runs_on_the_worker(
    api_node: RunningNode, client_env: None
) -> None:
    with running_worker(app, api_node):
        accepted = double.submit(21)  # the default client, from DISPATCH_URL / _API_KEY
        assert accepted.warning is None  # a worker serves it
        job = accepted.wait(timeout_s=30)
        assert (job.exec, job.status, job.result) == ("tasks.double", "succeeded", 42)

        with Client(api_node.url, api_node.keys["client"]) as client:
            again = shout.submit("hi", exec="tasks.shout.loud", client=client, max_attempts=1)
            job = again.wait(timeout_s=30)
        assert (job.status, job.result, job.max_attempts) == (
            "succeeded", "tasks.shout.loud: HI", 1,
        )  # fmt: skip


def test_an_async_submit_runs_and_waits(api_node: RunningNode) -> None:
    async def scenario() -> object:
        async with AsyncClient(api_node.url, api_node.keys["client"]) as client:
            accepted = await double.submit_async(5, client=client)
            return (await accepted.wait(timeout_s=30)).result

    with running_worker(app, api_node):
        assert asyncio.run(scenario()) == 10


def test_the_warning_follows_the_workers_as_they_join_and_leave(api_node: RunningNode) -> None:
    with Client(api_node.url, api_node.keys["client"]) as client:
        # Nobody yet: the job is accepted, and the answer says it will wait.
        lonely = double.submit(1, client=client)
        assert lonely.status == "queued" and lonely.warning == _warning("tasks.double")
        with running_worker(app, api_node):
            assert double.submit(2, client=client).warning is None
            assert lonely.wait(timeout_s=30).result == 2  # the waiting job ran once served
            served = shout.submit("x", exec="tasks.shout.a", client=client)
            assert served.warning is None  # matched by the worker's wildcard
            assert double.submit(3, client=client, id=lonely.id).existing  # ended: no warning
        # The worker stopped (its socket closed, the leader lost it): warned again.
        wait_until(lambda: not client_workers(api_node), what="the worker to be lost")
        assert double.submit(4, client=client).warning == _warning("tasks.double")


def client_workers(node: RunningNode) -> list[str]:
    with Client(node.url, node.keys["admin"]) as admin:
        return [worker.worker_id for worker in admin.workers()]


def test_every_submit_path_carries_the_warning(api_node: RunningNode) -> None:
    with api_node.client("client") as http, api_node.client("worker") as worker:
        fast = http.post("/v1/jobs", json={"exec": "paths.one", "id": "p-1"})
        assert fast.status_code == 202 and fast.json()["warning"] == _warning("paths.one")
        # A query string sends the request through FastAPI's route instead of the fast path.
        routed = http.post("/v1/jobs?via=route", json={"exec": "paths.one", "id": "p-2"})
        assert routed.status_code == 202 and routed.json()["warning"] == _warning("paths.one")
        api_node.wait_known("p-1")
        # A known id still queued is still unserved: the repeat says so too.
        repeat = http.post("/v1/jobs", json={"exec": "paths.one", "id": "p-1"})
        assert repeat.status_code == 200 and repeat.json()["existing"]
        assert repeat.json()["warning"] == _warning("paths.one")

        assert poll(worker, "paths-worker", ["job.assign.paths.two"], credits=0, wait_s=0) == []
        batch = http.post(
            "/v1/jobs:batch", json={"jobs": [{"exec": "paths.one"}, {"exec": "paths.two"}]}
        )
        assert batch.status_code == 202, batch.text
        one, two = batch.json()["jobs"]
        assert one["warning"] == _warning("paths.one")
        assert "warning" not in two  # served: the answer is as it always was


def test_dispatch_submit_prints_the_warning_on_stderr(api_node: RunningNode) -> None:
    env = {**os.environ, "DISPATCH_URL": api_node.url, "DISPATCH_API_KEY": api_node.keys["client"]}
    done = subprocess.run(
        [sys.executable, "-m", "dispatch.cli", "submit", "cli.nobody", "--payload", "1"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"warning: {_warning('cli.nobody')}" in done.stderr
    assert "accepted job" in done.stdout and "warning" not in done.stdout

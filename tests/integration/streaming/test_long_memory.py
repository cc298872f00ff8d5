"""The leader forgets a finished job after its finished window; Delta remembers it. A real
node on the real broker, the real fold into real Delta tables: a pruned job is still read by
id with its result, a resubmission of its id is answered as the existing job and never runs,
and so it stays with a new leader, whose filter of finished ids comes from Delta."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import pytest

from dispatch.settings import Settings
from tests.integration.api.conftest import RunningNode, poll, poll_until, short_timeouts
from tests.integration.streaming.conftest import run_stream
from tests.integration.streaming.test_leader_e2e import node_running

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

SUBJECTS = ["job.assign.long.>"]


@pytest.fixture
def forgetful(topics: Settings) -> Settings:
    """A leader that keeps finished jobs one second, and at most two of them."""
    settings = short_timeouts(topics)
    dispatcher = settings.dispatcher.model_copy(
        update={"finished_window_s": 1.0, "finished_max": 2}
    )
    return settings.model_copy(update={"dispatcher": dispatcher})


def ack(worker: httpx.Client, assignment: dict[str, object]) -> None:
    job_id = str(assignment["id"])
    body = {
        "attempt": assignment["attempt"],
        "lease": assignment["lease"],
        "result": {"answer": job_id},
    }
    assert worker.post(f"/v1/jobs/{job_id}/ack", json=body).status_code == 200


def held(node: RunningNode, job_id: str) -> bool:
    return job_id in node.node.leader().core


def wait_pruned(node: RunningNode, job_ids: list[str], timeout_s: float = 30.0) -> None:
    """Until the leader forgot every one of `job_ids` (it prunes every few seconds)."""
    deadline = time.monotonic() + timeout_s
    while any(held(node, job_id) for job_id in job_ids):
        assert time.monotonic() < deadline, "the leader kept finished jobs past its window"
        time.sleep(0.2)


def test_a_pruned_job_is_read_from_delta_and_its_id_is_not_run_again(
    forgetful: Settings, spark: SparkSession
) -> None:
    ids = [f"long-{n}" for n in range(4)]
    with (
        node_running(forgetful) as node,
        node.client("admin") as admin,
        node.client("worker") as worker,
    ):
        for job_id in ids:
            accepted = admin.post("/v1/jobs", json={"id": job_id, "exec": "long.job"})
            assert accepted.status_code == 202, accepted.text
        for assignment in poll_until(worker, "w1", SUBJECTS, len(ids)):
            ack(worker, assignment)
        wait_pruned(node, ids)
        assert len(node.node.leader().core) == 0

        # The fold archives what the leader pruned.
        run_stream(forgetful, spark)

        # Read by id: from Delta, result and all.
        for job_id in ids:
            answer = admin.get(f"/v1/jobs/{job_id}")
            assert answer.status_code == 200, answer.text
            job = answer.json()
            assert job["status"] == "succeeded" and job["result"] == {"answer": job_id}
        assert admin.get("/v1/jobs/never-submitted").status_code == 404
        cancel = admin.delete(f"/v1/jobs/{ids[0]}")
        assert cancel.status_code == 409 and cancel.json()["error"] == "not_cancellable"
        assert "succeeded" in cancel.json()["detail"]

        # A resubmission is the existing job: answered 200, nothing enqueued, nothing runs.
        again = admin.post("/v1/jobs", json={"id": ids[0], "exec": "long.job"})
        assert again.status_code == 200, again.text
        assert again.json() == {"id": ids[0], "status": "succeeded", "existing": True}
        batch = admin.post(
            "/v1/jobs:batch",
            json={"jobs": [{"id": ids[1], "exec": "long.job"}, {"exec": "long.job"}]},
        )
        assert batch.status_code == 202, batch.text
        first, fresh = batch.json()["jobs"]
        assert first["existing"] is True and fresh.get("existing") is not True
        [assigned] = poll_until(worker, "w1", SUBJECTS, 1)
        assert assigned["id"] == fresh["id"]
        ack(worker, assigned)
        assert poll(worker, "w1", SUBJECTS, credits=4, wait_s=1.0) == []
        assert not held(node, ids[0]) and not held(node, ids[1])

    # A new leader: its filter of finished ids is loaded from Delta.
    with node_running(forgetful) as node, node.client("admin") as admin:
        leader = node.node.leader()
        assert leader.finished_ids.loaded.wait(30), "the filter never loaded from Delta"
        assert all(leader.finished_ids.may_hold(job_id) for job_id in ids)
        again = admin.post("/v1/jobs", json={"id": ids[2], "exec": "long.job"})
        assert again.status_code == 200 and again.json()["existing"] is True, again.text
        assert admin.get(f"/v1/jobs/{ids[3]}").json()["result"] == {"answer": ids[3]}

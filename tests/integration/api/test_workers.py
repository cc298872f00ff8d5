"""Workers over REST: timeouts, retries elsewhere, the DLQ, lost workers, caps, fairness.

The test node runs with a 1 s first ack timeout doubling to at most 4 s, 3 attempts, and a
3 s worker expiry (see `api_settings`)."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest

from dispatch.api.memory_log import MemoryLog
from dispatch.settings import Settings
from tests.integration.api.conftest import RunningNode, poll, poll_until, start_node

pytestmark = pytest.mark.integration

SUBJECTS = ["job.assign.work.*"]


def _ack(worker: httpx.Client, assignment: dict[str, object]) -> httpx.Response:
    return worker.post(
        f"/v1/jobs/{assignment['id']}/ack",
        json={"attempt": assignment["attempt"], "lease": assignment["lease"]},
    )


def test_a_job_never_acked_moves_to_another_worker_with_growing_deadlines_then_dies(
    api_node: RunningNode,
) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        admin.post("/v1/jobs", json={"id": "hang", "exec": "work.hang"})
        seen: list[tuple[str, dict[str, object]]] = []
        # Both workers keep credit; neither acks. Each attempt should go to the other one.
        deadline = time.monotonic() + 30
        while len(seen) < 3:
            assert time.monotonic() < deadline, f"only {seen}"
            for worker_id in ("w1", "w2"):
                for assignment in poll(worker, worker_id, SUBJECTS, credits=1, wait_s=0.3):
                    seen.append((worker_id, assignment))
        workers = [worker_id for worker_id, _ in seen]
        assert workers[0] != workers[1] and workers[1] != workers[2]
        attempts = [assignment["attempt"] for _, assignment in seen]
        assert attempts == [1, 2, 3]
        windows = [
            float(str(assignment["deadline"]))
            - float(admin.get("/v1/jobs/hang").json()["submitted_at"])
            for _, assignment in seen
        ]
        assert windows[0] < windows[1] < windows[2], f"deadlines do not grow: {windows}"

        # Keep both workers alive (polling with no room) until the last deadline passes.
        deadline = time.monotonic() + 15
        while (job := admin.get("/v1/jobs/hang").json())["status"] != "dead":
            assert time.monotonic() < deadline, job
            for worker_id in ("w1", "w2"):
                assert poll(worker, worker_id, SUBJECTS, credits=0, wait_s=0) == []
            time.sleep(0.3)
        assert (job["status"], job["dead_reason"], job["attempts"]) == ("dead", "ack_timeout", 3)
        stale = _ack(worker, seen[0][1])
        assert stale.status_code == 409
        assert stale.json()["error"] == "stale_lease"


def test_a_worker_that_stops_polling_is_lost_and_its_jobs_complete_elsewhere(
    api_settings: Settings,
) -> None:
    # A long ack timeout: only the loss of the worker can move these jobs.
    settings = api_settings.model_copy(
        update={
            "dispatcher": api_settings.dispatcher.model_copy(
                update={"ack_timeout_s": 120.0, "max_ack_timeout_s": 120.0}
            )
        }
    )
    running, server, thread = start_node(settings, io=MemoryLog(settings))
    try:
        with running.client("admin") as admin, running.client("worker") as worker:
            admin.post(
                "/v1/jobs:batch",
                json={"jobs": [{"id": f"k{n}", "exec": "work.x"} for n in range(3)]},
            )
            taken = poll_until(worker, "doomed", SUBJECTS, 3)
            assert {assignment["id"] for assignment in taken} == {"k0", "k1", "k2"}
            # "doomed" never polls again; after its 3 s expiry its jobs go to "rescuer".
            started = time.monotonic()
            rescued = poll_until(worker, "rescuer", SUBJECTS, 3, timeout_s=20)
            assert time.monotonic() - started < 15
            assert {assignment["id"] for assignment in rescued} == {"k0", "k1", "k2"}
            assert all(assignment["attempt"] == 2 for assignment in rescued)
            for assignment in rescued:
                assert _ack(worker, assignment).status_code == 200
            assert _ack(worker, taken[0]).status_code == 409
            for n in range(3):
                assert admin.get(f"/v1/jobs/k{n}").json()["status"] == "succeeded"
            assert "doomed" not in [
                w["worker_id"] for w in admin.get("/v1/workers").json()["workers"]
            ]
    finally:
        server.should_exit = True
        thread.join(30)


def test_per_client_caps_hold_while_other_clients_go_on(api_settings: Settings) -> None:
    settings = api_settings.model_copy(
        update={
            "dispatcher": api_settings.dispatcher.model_copy(
                update={"caps": {"greedy": 2}, "ack_timeout_s": 60.0, "max_ack_timeout_s": 60.0}
            )
        }
    )
    running, server, thread = start_node(settings, io=MemoryLog(settings))
    try:
        with running.client("admin") as admin, running.client("worker") as worker:
            jobs = [{"id": f"g{n}", "exec": "work.x", "client_id": "greedy"} for n in range(20)]
            jobs += [{"id": f"m{n}", "exec": "work.x", "client_id": "modest"} for n in range(3)]
            assert admin.post("/v1/jobs:batch", json={"jobs": jobs}).status_code == 202
            time.sleep(1.0)  # let the leader consume them all before anyone has credit
            taken = poll_until(worker, "w1", SUBJECTS, 5)
            by_client = Counter(str(assignment["id"])[0] for assignment in taken)
            assert by_client == {"g": 2, "m": 3}
            assert poll(worker, "w1", SUBJECTS, credits=10, wait_s=1.0) == []
            # Finishing one of greedy's jobs frees exactly one slot for it.
            assert (
                _ack(worker, next(a for a in taken if str(a["id"]).startswith("g"))).status_code
                == 200
            )
            [next_one] = poll_until(worker, "w1", SUBJECTS, 1)
            assert str(next_one["id"]).startswith("g")
    finally:
        server.should_exit = True
        thread.join(30)


def test_round_robin_serves_a_small_exec_queue_beside_a_busy_one(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        busy = [{"id": f"busy{n}", "exec": "work.busy"} for n in range(300)]
        small = [{"id": f"small{n}", "exec": "work.small"} for n in range(5)]
        admin.post("/v1/jobs:batch", json={"jobs": busy})
        admin.post("/v1/jobs:batch", json={"jobs": small})
        deadline = time.monotonic() + 20
        while sum(q["ready"] for q in admin.get("/v1/queues").json()["queues"]) < 305:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        first_ten = poll_until(worker, "w1", SUBJECTS, 10)
        execs = Counter(str(assignment["id"]).rstrip("0123456789") for assignment in first_ten)
        assert execs == {"busy": 5, "small": 5}

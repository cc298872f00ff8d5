"""The consistency checks catch broken states (so the property tests can trust them)."""

from __future__ import annotations

import pytest

from dispatch.core import check_invariants, state_view
from dispatch.core.checks import check_caps, check_work_conserving
from tests.unit.core.helpers import T0, make, request, worker


def test_a_healthy_state_passes() -> None:
    d = make()
    worker(d, "w", credits=1)
    d.submit_many([request("a"), request("b"), request("c", delay_s=5.0)], T0)
    check_invariants(d)
    check_work_conserving(d)
    check_caps(d)
    assert set(state_view(d)) == {
        "epoch",
        "assign_seq",
        "next_seq",
        "front_seq",
        "jobs",
        "workers",
        "inflight",
        "dead_letters",
        "pauses",
        "limits",
    }


def test_a_wrong_count_is_caught() -> None:
    d = make()
    d.submit(request("a"), T0)
    d.state._counts["queued"] += 1
    with pytest.raises(AssertionError, match="count of queued"):
        check_invariants(d)


def test_a_job_lost_from_its_queue_is_caught() -> None:
    d = make()
    d.submit(request("a"), T0)
    lane = next(iter(d.state._queues["image.resize"].lanes()))
    lane.jobs.clear()
    with pytest.raises(AssertionError):
        check_invariants(d)


def test_negative_credit_is_caught() -> None:
    d = make()
    worker(d, "w")
    d.state._workers["w"].credit = -1
    with pytest.raises(AssertionError, match="negative credit"):
        check_invariants(d)


def test_a_job_left_waiting_next_to_a_free_worker_is_caught() -> None:
    d = make()
    worker(d, "w", credits=1)
    d.submit(request("a"), T0, dispatch=False)
    with pytest.raises(AssertionError, match="waits under its cap"):
        check_work_conserving(d)


def test_a_client_over_its_cap_is_caught() -> None:
    d = make(default_cap=1)
    worker(d, "w", credits=1)
    d.submit(request("a"), T0)
    d.state._clients["default"].cap = 0
    with pytest.raises(AssertionError, match="cap"):
        check_caps(d)


def test_a_running_job_without_its_run_limit_is_caught() -> None:
    d = make()
    worker(d, "w", credits=1)
    d.submit(request("a", max_run_s=30.0), T0)
    check_invariants(d)
    job = d.state._jobs["a"]
    job.run_limit_at = None
    with pytest.raises(AssertionError, match="run_limit_at"):
        check_invariants(d)


def test_a_job_a_key_holds_counts_as_queued_and_a_wrong_limited_count_is_caught() -> None:
    d = make()
    d.set_limit("key", "k", T0, max_inflight=1)
    worker(d, "w", credits=5)
    d.submit_many([request("a", key="k"), request("b", key="k")], T0)
    check_invariants(d)
    check_work_conserving(d)
    d.state._queues["image.resize"].limited += 1
    with pytest.raises(AssertionError, match="limited count off"):
        check_invariants(d)


def test_a_wrong_key_running_count_is_caught() -> None:
    d = make()
    worker(d, "w", credits=5)
    d.submit(request("a", key="k"), T0)
    d.state._keys["k"].inflight += 1
    with pytest.raises(AssertionError, match="key k"):
        check_invariants(d)

"""Expiry: a job not started by its `expires_at` ends `expired` and never runs."""

from __future__ import annotations

import pytest

from dispatch.core import (
    Dispatcher,
    Expired,
    JobRecord,
    RejectCode,
    Rejected,
    SubmitRequest,
    check_invariants,
)
from dispatch.core.config import CoreConfig
from dispatch.core.retry import RetryPolicy
from tests.unit.core.helpers import T0, assigned_ids, assignments, make, request, types, worker


def test_a_job_nobody_takes_expires_at_its_ttl() -> None:
    core = make()
    events = core.submit(request("a", ttl_s=30.0), T0)
    assert events[0].expires_at == T0 + 30  # type: ignore[attr-defined]
    assert core.next_timer_at() == T0 + 30, "the leader wakes up for it: no scan per tick"
    assert core.tick(T0 + 29.9) == []
    events = core.tick(T0 + 30)
    assert [type(event) for event in events] == [Expired]
    job = core.job("a")
    assert job is not None and job.status.value == "expired" and job.is_terminal
    assert job.error is not None and "expired" in job.error
    assert core.counts()["expired"] == 1 and core.counts()["queued"] == 0
    check_invariants(core)
    # A worker arriving later never gets it.
    assert assigned_ids(worker(core, "w", credits=5, now=T0 + 31)) == []


def test_a_worker_arriving_at_the_expiry_does_not_get_the_job() -> None:
    core = make()
    core.submit(request("a", expires_at=T0 + 10), T0)
    events = worker(core, "w", credits=1, now=T0 + 10)
    assert "expired" in types(events) and assigned_ids(events) == []


def test_a_delayed_job_whose_delay_outlasts_its_expiry_never_runs() -> None:
    core = make()
    worker(core, "w", credits=5)
    core.submit(request("a", delay_s=60.0, ttl_s=30.0), T0)
    assert types(core.tick(T0 + 30)) == ["expired"]
    assert core.tick(T0 + 60) == []
    check_invariants(core)


def test_a_running_job_is_not_expired_but_its_retry_is() -> None:
    """Expiry is about starting: an attempt that started runs on (a time limit is another
    control); a next attempt that would start after the expiry never does."""
    core = make(retry=RetryPolicy(delay_s=20.0))
    first = assignments(worker(core, "w", credits=5) + core.submit(request("a", ttl_s=10), T0))[0]
    assert core.tick(T0 + 15) == []
    job = core.job("a")
    assert job is not None and job.status.value == "running"
    events = core.fail("a", 1, first.lease, T0 + 16)
    assert types(events) == ["requeued", "expired"], "no attempt starts after the expiry"


def test_an_expired_job_cannot_be_cancelled_or_redriven() -> None:
    core = make()
    core.submit(request("a", ttl_s=1.0), T0)
    core.tick(T0 + 1)
    with pytest.raises(Rejected) as cancelled:
        core.cancel("a", T0 + 2)
    assert cancelled.value.code is RejectCode.NOT_CANCELLABLE
    with pytest.raises(Rejected) as redriven:
        core.redrive("a", T0 + 2)
    assert redriven.value.code is RejectCode.NOT_DEAD


def test_a_redriven_dead_job_loses_its_expiry() -> None:
    """An operator's redrive is a decision to run it: the submitter's deadline no longer
    applies."""
    core = make(max_attempts=1)
    first = assignments(worker(core, "w", credits=5) + core.submit(request("a", ttl_s=5), T0))[0]
    core.fail("a", 1, first.lease, T0, retryable=False)
    events = core.redrive("a", T0 + 100)
    assert assigned_ids(events) == ["a"]
    job = core.job("a")
    assert job is not None and job.expires_at is None


def test_a_rebuilt_leader_still_expires_the_job() -> None:
    core = make()
    core.submit(request("a", ttl_s=30.0), T0)
    records = [JobRecord.from_dict(job.to_dict()) for job in core.jobs()]
    restored = Dispatcher.restore(records, config=CoreConfig(worker_expiry_s=None))
    assert restored.next_timer_at() == T0 + 30
    assert types(restored.tick(T0 + 30)) == ["expired"]


def test_expired_jobs_are_pruned_like_other_finished_jobs() -> None:
    core = make()
    core.submit(request("a", ttl_s=1.0), T0)
    core.tick(T0 + 1)
    assert types(core.prune(T0 + 1, T0 + 2)) == ["pruned"]
    assert core.job("a") is None
    # The id may be submitted again: a new life.
    core.submit(request("a"), T0 + 3)
    job = core.job("a")
    assert job is not None and job.status.value == "queued"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"ttl_s": -1.0}, "ttl_s"),
        ({"ttl_s": 0.0}, "ttl_s"),
        ({"expires_at": -5.0}, "expires_at"),
        ({"expires_at": 10.0, "ttl_s": 5.0}, "ttl_s"),
    ],
)
def test_a_bad_expiry_is_refused_naming_the_field(fields: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        SubmitRequest(id="a", exec="x", payload=None, **fields)  # type: ignore[arg-type]

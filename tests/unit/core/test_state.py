"""Folding logged events with apply: strictness, replay of time, placeholders after a restore."""

from __future__ import annotations

import pytest

from dispatch.core import (
    Assigned,
    Completed,
    CreditGranted,
    Dispatcher,
    InvalidTransition,
    JobStatus,
    LeaderElected,
    WorkerLost,
    check_invariants,
    state_view,
)
from tests.unit.core.helpers import T0, assignments, make, request, worker


def test_an_event_that_contradicts_the_state_is_refused_and_changes_nothing() -> None:
    d = make()
    worker(d, "w", credits=1)
    d.submit(request("j1"), T0)
    before = state_view(d)
    bad = [
        Completed(epoch=0, at=T0, job_id="nope", worker_id="w", attempt=1, lease="0.1"),
        Completed(epoch=0, at=T0, job_id="j1", worker_id="w", attempt=1, lease="wrong"),
        Assigned(epoch=0, at=T0, job_id="j1", worker_id="w", attempt=2, lease="0.9", deadline=1.0),
        WorkerLost(epoch=0, at=T0, worker_id="w"),
    ]
    for event in bad:
        with pytest.raises(InvalidTransition):
            d.apply(event)
        assert state_view(d) == before
    check_invariants(d)


def test_apply_returns_false_for_fenced_events() -> None:
    d = make()
    assert d.apply(LeaderElected(epoch=2, at=T0))
    assert not d.apply(CreditGranted(epoch=1, at=T0, worker_id="w", credits=1))
    assert d.worker("w") is None and d.epoch == 2


def test_replay_releases_delayed_jobs_as_the_log_advances() -> None:
    live = make()
    log = live.submit(request("later", delay_s=10.0), T0)
    log += worker(live, "w", credits=1, now=T0 + 20)
    (assigned,) = assignments(log)
    assert assigned.at == T0 + 20
    replica = Dispatcher(live.config)
    replica.apply_all(log)
    check_invariants(replica)
    assert replica.job("later").status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_events_naming_an_unknown_worker_create_a_placeholder() -> None:
    # A restored snapshot does not know workers that held nothing; the log tail may name them.
    d = make()
    d.submit(request("j1"), T0)
    d.apply(
        Assigned(
            epoch=0, at=T0, job_id="j1", worker_id="w9", attempt=1, lease="0.1", deadline=T0 + 30
        )
    )
    placeholder = d.worker("w9")
    assert placeholder is not None and placeholder.subjects == () and placeholder.credit == 0
    assert placeholder.running == ("j1",)
    check_invariants(d)


def test_credit_never_goes_below_zero_on_replay() -> None:
    d = make()
    worker(d, "w", credits=0)
    d.submit(request("j1"), T0)
    d.apply(
        Assigned(
            epoch=0, at=T0, job_id="j1", worker_id="w", attempt=1, lease="0.1", deadline=T0 + 1
        )
    )
    assert d.worker("w").credit == 0  # type: ignore[union-attr]

"""The figures of a replay, from either side's events, and their comparison."""

from __future__ import annotations

import pytest

from dispatch.core.commands import SubmitRequest
from dispatch.core.config import CoreConfig
from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import Assigned, Event
from dispatch.core.leases import seeded_lease_tokens
from dispatch.replay.report import ALL, CLIENT, EXEC, compare, figures_by_group, percentile


def lease(events: list[Event], job_id: str) -> str:
    return next(e.lease for e in events[::-1] if isinstance(e, Assigned) and e.job_id == job_id)


def small_log() -> list[Event]:
    """acme: two jobs wait for the one slot (1 s, 2 s), one fails and runs again at once;
    globex: a job delayed to 13 s, assigned at 14 s."""
    d = Dispatcher(CoreConfig(worker_expiry_s=None), lease_token=seeded_lease_tokens(0))
    log = d.submit(SubmitRequest(id="a1", exec="x.run", payload=None, client_id="acme"), 10.0)
    log += d.submit(SubmitRequest(id="a2", exec="x.run", payload=None, client_id="acme"), 10.0)
    log += d.submit(
        SubmitRequest(id="g1", exec="y.run", payload=None, client_id="globex", not_before=13.0),
        10.0,
    )
    log += d.join("w", ["job.assign.>"], 11.0) + d.grant_credit("w", 1, 11.0)
    log += d.ack("a1", 1, lease(log, "a1"), 12.0) + d.grant_credit("w", 1, 12.0)
    log += d.tick(13.0)  # g1 becomes ready, no credit left
    log += d.fail("a2", 1, lease(log, "a2"), 14.0) + d.grant_credit("w", 2, 14.0)
    log += d.ack("g1", 1, lease(log, "g1"), 15.0)
    log += d.ack("a2", 2, lease(log, "a2"), 16.0)
    return log


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([0.0, 10.0], 0.5) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == pytest.approx(4.8)
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)


def test_queue_wait_counts_from_entering_the_queue_and_a_delay_is_not_waiting() -> None:
    figures = figures_by_group(small_log())
    acme = figures[CLIENT, "acme"]
    # a1 waited 1 s (no worker), a2 2 s (behind a1), then 0 s after its requeue at 14.
    assert (acme.queue_wait_p50_s, acme.attempts, acme.completed) == (1.0, 3, 2)
    globex = figures[CLIENT, "globex"]
    assert globex.queue_wait_p50_s == 1.0  # assigned at 14, not before 13
    assert figures[EXEC, "y.run"].jobs == 1
    assert figures[ALL, ALL].jobs == 3


def test_throughput_is_completions_over_first_submit_to_last_completion() -> None:
    figures = figures_by_group(small_log())
    assert figures[ALL, ALL].throughput_per_s == pytest.approx(3 / 6)
    assert figures[CLIENT, "acme"].throughput_per_s == pytest.approx(2 / 6)


def test_comparison_lists_all_then_execs_then_clients_and_fills_missing_sides() -> None:
    log = small_log()
    only_acme = [e for e in log if getattr(e, "job_id", "a").startswith("a")]
    groups = compare(log, only_acme)
    assert [(g.dimension, g.key) for g in groups] == [
        (ALL, ALL),
        (EXEC, "x.run"),
        (EXEC, "y.run"),
        (CLIENT, "acme"),
        (CLIENT, "globex"),
    ]
    globex = groups[-1]
    assert globex.actual.jobs == 1
    assert (globex.simulated.jobs, globex.simulated.queue_wait_p99_s) == (0, None)

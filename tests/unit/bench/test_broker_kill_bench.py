"""The broker kill benchmark's pure parts: which brokers it kills and the summary it prints."""

from __future__ import annotations

from dispatch.bench.broker_kill_bench import PAUSE_GOAL_S, Round, kill_plan, summary
from dispatch.bench.harness_load import Outcome


def test_the_kill_plan_is_random_reproducible_and_within_the_cluster() -> None:
    plan = kill_plan(50, 3, seed=1)
    assert plan == kill_plan(50, 3, seed=1)
    assert plan != kill_plan(50, 3, seed=2)
    assert set(plan) == {1, 2, 3}
    assert len(kill_plan(5, 3, seed=7)) == 5


def _round(pause: float, accepted: float) -> Round:
    return Round(
        node=1,
        led_events=False,
        kill_to_first_completed_s=pause,
        kill_to_first_accepted_s=accepted,
        restart_s=10.0,
        resync_s=1.0,
    )


def test_the_summary_has_the_pause_percentiles_and_what_was_lost() -> None:
    outcome = Outcome(
        accepted=100, succeeded=99, not_succeeded=["x"], completed_twice=0, wait_s=1.0
    )
    result = summary([_round(1.0, 0.5), _round(3.0, 0.7), _round(2.0, 0.6)], outcome, 4)
    assert result["pause_s"] == {"p50": 2.0, "max": 3.0, "n": 3}
    assert result["kill_to_first_accepted_s"] == {"p50": 0.6, "max": 0.7, "n": 3}
    assert result["within_goal"] is True
    assert (result["lost"], result["not_succeeded"], result["completed_twice"]) == (1, ["x"], 0)
    assert result["submissions_refused_or_unanswered"] == 4


def test_a_pause_past_the_goal_is_flagged() -> None:
    outcome = Outcome(accepted=1, succeeded=1, not_succeeded=[], completed_twice=0, wait_s=0.0)
    assert summary([_round(PAUSE_GOAL_S + 0.1, 1.0)], outcome, 0)["within_goal"] is False
    assert summary([], outcome, 0)["within_goal"] is False

"""The fairness bench's simulation: the dispatcher keeps light tenants' waits when one floods,
a FIFO queue does not, and the same seed gives the same figures."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dispatch.bench.fairness_bench import (
    FLOOD,
    Workload,
    classes,
    limit_summary,
    main,
    measure,
    percentile,
    run_dispatcher,
    run_fifo,
)

OVERLOADED = Workload(light=3, rate=1.0, flood_factor=50.0, workers=4, slots=2, duration_s=60.0)
"""Capacity 16 jobs/s against 53 offered: the flood's backlog grows all run long."""


def test_round_robin_keeps_light_tenants_waits_while_fifo_buries_them() -> None:
    results = measure(OVERLOADED)
    solo, fair, fifo = (results[run]["light"] for run in ("solo", "round_robin", "fifo"))
    assert solo.waiting_at_end == 0
    assert fair.waiting_at_end <= 1  # at most one that arrived in the run's last moment
    # A light job waits for a slot to free behind the few other tenants in the rotation:
    # about a run time, not the flood's backlog.
    assert fair.p99 - solo.p99 < 4 * OVERLOADED.run_s
    # Behind the flood in arrival order: tens of seconds, and many never start.
    assert fifo.p99 > 20.0 and fifo.waiting_at_end > 50
    assert fifo.p99 > 20 * fair.p99
    # The flood pays for its own backlog either way.
    assert results["round_robin"][FLOOD].waiting_at_end > 0


def test_both_schedulers_do_the_same_work_when_the_fleet_keeps_up() -> None:
    calm = Workload(light=3, rate=1.0, flood_factor=2.0, workers=4, slots=4, duration_s=60.0)
    arrivals = calm.arrivals(flood=True)
    fair, fifo = classes(run_dispatcher(calm, arrivals)), classes(run_fifo(calm, arrivals))
    for name in ("light", FLOOD):
        assert fair[name].started == fifo[name].started
        assert fair[name].waiting_at_end == fifo[name].waiting_at_end == 0
        assert fair[name].p99 == fifo[name].p99 == 0.0


def test_the_same_seed_gives_the_same_figures_and_another_seed_others() -> None:
    assert measure(OVERLOADED) == measure(OVERLOADED)
    assert measure(replace(OVERLOADED, seed=2)) != measure(OVERLOADED)


def test_light_arrivals_do_not_change_when_the_flood_is_added() -> None:
    alone = OVERLOADED.arrivals(flood=False)
    flooded = [a for a in OVERLOADED.arrivals(flood=True) if a.tenant != FLOOD]
    assert alone == flooded and len(alone) > 100


def test_nearest_rank_percentiles() -> None:
    assert percentile([], 0.99) == 0.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(n) for n in range(1, 101)], 0.99) == 99.0


def test_the_command_prints_the_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--light", "2", "--duration", "20", "--workers", "2", "--slots", "2"]) == 0
    printed = capsys.readouterr().out
    assert "round_robin  light" in printed and "fifo         flood" in printed
    assert "light tenants' p99 queue wait: solo" in printed


def test_a_rate_limited_flood_starts_at_its_limit_and_leaves_the_others_their_waits() -> None:
    limited = replace(OVERLOADED, duration_s=120.0, limit_rate=8.0)
    results = measure(limited, "limit")
    assert set(results) == {"solo", "limited"}
    summary = limit_summary(limited, results)
    # 50 jobs/s offered against 8/s allowed: the flood starts at its limit (plus one burst).
    assert summary["within_tolerance"] and abs(summary["achieved_over_limit"] - 1) < 0.02
    assert results["limited"][FLOOD].waiting_at_end > 1_000
    # The fleet (16/s) has room beside 8/s: the light tenants barely notice the flood.
    light, solo = results["limited"]["light"], results["solo"]["light"]
    assert light.started + light.waiting_at_end == solo.started  # the same arrivals
    assert light.waiting_at_end <= 1  # at most one that arrived in the run's last moment
    assert summary["light_p99_over_solo_s"] < 2 * limited.run_s


def test_the_limited_run_is_in_the_default_output_and_can_be_picked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--light", "2", "--duration", "20", "--workers", "2", "--slots", "2"]
    assert main([*args, "--limit-rate", "3"]) == 0
    printed = capsys.readouterr().out
    assert "round_robin  light" in printed and "limited      flood" in printed
    assert "the flood rate-limited to 3/s started" in printed
    assert main([*args, "--limit-rate", "3", "--scenario", "limit", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document["results"]) == {"solo", "limited"}
    assert document["limit"]["limit_rate"] == 3.0 and document["workload"]["limit_rate"] == 3.0
    with pytest.raises(ValueError, match="scenario"):
        measure(OVERLOADED, "nope")

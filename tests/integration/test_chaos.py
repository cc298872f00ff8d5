"""The chaos run, short (`dispatch.bench.chaos`): 300 jobs at 20/s through a real stack (broker,
fold, two nodes, two worker processes) with one leader kill -9 and one worker kill -9. Every safety
count must be 0 and each canary must finish within 10 s of its fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatch.bench.chaos import ChaosOptions, result_json, run_chaos
from dispatch.bench.chaos_audit import CANARY_BOUND_S

pytestmark = pytest.mark.integration


@pytest.mark.timeout(900)
def test_a_short_chaos_run_loses_nothing_and_keeps_moving(tmp_path: Path) -> None:
    options = ChaosOptions(
        jobs=300, rate=20.0, faults=("leader", "worker"), seed=13, workers=2, slots=8,
        settle_timeout_s=120.0, delta_timeout_s=180.0, scratch=tmp_path / "chaos",
    )  # fmt: skip
    result = run_chaos(options)
    report = json.dumps(result_json(result), indent=1)
    (tmp_path / "chaos.json").write_text(report)
    assert result.load["accepted"] >= 250, report
    assert all(count == 0 for count in result.safety.values()), report
    for fault in result.faults:
        assert fault.canary_status == "succeeded", report
        assert fault.canary_s is not None and fault.canary_s <= CANARY_BOUND_S, report
    assert result.passed, report


@pytest.mark.timeout(1200)
def test_the_cluster_profile_loses_nothing_when_a_broker_the_leader_and_the_fold_die(
    tmp_path: Path,
) -> None:
    """The cluster profile (3 brokers, the warehouse, lease and checkpoint on S3Proxy, the
    fold on a Spark standalone cluster, 3 API nodes): one broker, the leader and the fold's
    driver killed with -9 while jobs run. Nothing lost or done twice, the Delta tables on the
    object store agree with the API, and work moves again after each kill."""
    options = ChaosOptions(
        jobs=300, rate=10.0, faults=("broker", "leader", "streaming"), seed=17, workers=2,
        slots=8, settle_timeout_s=180.0, delta_timeout_s=400.0, scratch=tmp_path / "chaos",
        profile="cluster",
    )  # fmt: skip
    result = run_chaos(options)
    report = json.dumps(result_json(result), indent=1)
    (tmp_path / "chaos.json").write_text(report)
    assert result.load["accepted"] >= 250, report
    assert all(count == 0 for count in result.safety.values()), report
    assert (tmp_path / "chaos" / "var" / "object-store" / "dispatch" / "warehouse").is_dir()
    for fault in result.faults:
        assert fault.canary_status == "succeeded", report
        assert fault.canary_s is not None and fault.canary_s <= 60.0, report
    assert result.passed, report

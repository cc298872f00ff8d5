"""The core bench's limits rows: with limits on, each limit is in force and holds what it
should, yet every job of the measured loops starts at its submit; the quick path prints both
sides and their ratio."""

from __future__ import annotations

import json

import pytest

from dispatch.bench.core_bench import (
    EXEC_MAX_INFLIGHT,
    T0,
    TENANT_RATE,
    bench_limits,
    check_limits_hold,
    limit_cycles_batched,
    limit_cycles_per_call,
    limit_requests,
    limited,
    main,
    report,
)
from dispatch.core import Assigned, SubmitRequest


def job(job_id: str, client: str, key: str, exec_name: str = "exec0.run") -> SubmitRequest:
    return SubmitRequest(id=job_id, exec=exec_name, payload=None, client_id=client, key=key)


def test_limits_on_are_in_force_and_hold_what_exceeds_them() -> None:
    on = limited(tenants=10, on=True)
    client, key = on.limit_view("client", "tenant00003"), on.limit_view("key", "*")
    assert client is not None and client["rate"] == TENANT_RATE and client["source"] == "settings"
    assert key is not None and key["max_inflight"] == 1 and key["source"] == "runtime"
    # A second running job of a key waits for the first.
    assert isinstance(on.submit(job("a", "tenant00001", "account:1"), T0)[-1], Assigned)
    assert not any(
        isinstance(e, Assigned) for e in on.submit(job("b", "tenant00002", "account:1"), T0)
    )
    # A tenant's burst (its rate, 50) starts at once; the rest waits for tokens.
    started = sum(
        isinstance(event, Assigned)
        for n in range(60)
        for event in on.submit(job(f"r{n}", "tenant00003", f"k{n}"), T0)
    )
    assert started == int(TENANT_RATE)
    off = limited(tenants=10, on=False)
    assert off.limit_views() == [] and off.limits() == []


def test_the_exec_limit_is_shared_by_the_execs_it_matches() -> None:
    on = limited(tenants=1, on=True)
    view = on.limit_view("exec", "*.run")
    assert view is not None and view["max_inflight"] == EXEC_MAX_INFLIGHT


@pytest.mark.parametrize("kind", ["key", "client", "exec"])
def test_the_probe_after_a_run_fails_when_a_limit_does_not_hold(kind: str) -> None:
    check_limits_hold(limited(tenants=10, on=kind), kind, T0)  # in force: passes
    with pytest.raises(AssertionError, match="not applied"):
        check_limits_hold(limited(tenants=10, on=False), kind, T0)


def test_both_loops_start_every_job_at_its_submit_with_limits_on_and_off() -> None:
    batch = limit_requests(3_000, tenants=100, keys=1_000)
    assert len({request.key for request in batch}) == 1_000
    assert len({request.client_id for request in batch}) == 100
    for on in (False, True):
        # Each asserts that every job started at once.
        assert limit_cycles_per_call(batch, 100, on) > 0
        assert limit_cycles_batched(batch, 100, on) > 0


def test_the_comparison_reports_both_sides_and_their_ratio() -> None:
    result = bench_limits(2_000, tenants=50, keys=500, repeats=2)
    assert (result["jobs"], result["tenants"], result["keys"]) == (2_000, 50, 500)
    for name in ("per_call", "batched"):
        row = result[name]
        assert row["off_s"] > 0 and row["on_s"] > 0
        assert row["ratio"] == pytest.approx(row["on_s"] / row["off_s"])
        assert row["pair_ratio_min"] <= row["pair_ratio_max"]


def test_the_quick_limits_only_command(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--quick", "--limits-only", "--json"])
    document = json.loads(capsys.readouterr().out)
    limits = document["limits"]
    assert (limits["jobs"], limits["tenants"], limits["keys"]) == (20_000, 1_000, 10_000)
    assert limits["per_call"]["ratio"] > 0 and "tick" not in document
    printed = report(document)
    assert "limits, 20,000 jobs over 1,000 tenants and 10,000 keys" in printed
    assert printed.count("on/off") == 2 and "cycles, one core" not in printed

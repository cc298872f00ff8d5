"""`dispatch.bench.chaos_audit`: the job mix, the log and run audits, the schedule and the
verdict."""

from __future__ import annotations

from collections import Counter

import pytest

from dispatch.bench.chaos_audit import (
    CANARY_BOUND_S,
    FaultRecord,
    LogRecord,
    audit_log,
    audit_runs,
    canary_failures,
    disagreements,
    expected_status,
    fault_times,
    first_after,
    job_mix,
    lost_jobs,
    outage_windows,
    parse_faults,
    ran_across_an_outage,
    unexpected_jobs,
    verdict,
    wrong_states,
)
from dispatch.core.events import Completed, Enqueued, LeaderElected


def _elected(epoch: int) -> LeaderElected:
    return LeaderElected(epoch=epoch, at=0.0, holder=f"n{epoch}")


def _enqueued(epoch: int, job_id: str) -> Enqueued:
    return Enqueued(
        epoch=epoch, at=0.0, job_id=job_id, client_id="c", exec="chaos.ok", payload=None,
        max_attempts=3, timeout_s=5.0, seq=1,
    )  # fmt: skip


def _completed(epoch: int, job_id: str) -> Completed:
    return Completed(epoch=epoch, at=0.0, job_id=job_id, worker_id="w", attempt=1, lease="l")


def test_the_mix_is_reproducible_and_has_every_kind() -> None:
    first, again = job_mix(2000, seed=7), job_mix(2000, seed=7)
    assert first == again
    assert job_mix(2000, seed=8) != first
    kinds = Counter(job.kind for job in first)
    assert set(kinds) == {"ok", "flaky", "fail", "stall", "duplicate", "kafka", "malformed"}
    assert kinds["ok"] > 1400


def test_a_duplicate_repeats_an_earlier_success_outside_its_batch() -> None:
    planned = job_mix(2000, seed=3)
    position = {job.id: n for n, job in enumerate(planned) if job.kind != "duplicate"}
    for number, job in enumerate(planned):
        if job.kind == "duplicate":
            original = position[job.id]
            assert planned[original].kind == "ok"
            assert number - original >= 50


def test_each_job_is_expected_to_end_in_its_kinds_state() -> None:
    planned = job_mix(500, seed=1)
    expected = expected_status(planned)
    for job in planned:
        if job.kind == "malformed":
            assert job.id not in expected
            assert job.raw is not None
        elif job.kind == "duplicate":
            assert expected[job.id] == "succeeded"
        else:
            assert expected[job.id] == {"fail": "dead", "stall": "dead"}.get(job.kind, "succeeded")


def test_a_stall_job_times_out_twice() -> None:
    stall = next(job for job in job_mix(2000, seed=1) if job.kind == "stall")
    body = stall.body()
    assert body["timeout_s"] == 1.0 and body["max_attempts"] == 2
    assert body["payload"]["s"] > 1.0 + 2.0 / 2  # longer than either deadline


def test_events_of_a_deposed_epoch_are_counted_not_admitted() -> None:
    records = [
        LogRecord(1.0, 1, [_elected(1), _enqueued(1, "a"), _enqueued(1, "b")]),
        LogRecord(2.0, 2, [_elected(2), _completed(2, "a")]),
        # epoch 1 writes after epoch 2 was elected: void
        LogRecord(3.0, 1, [_completed(1, "b"), _enqueued(1, "c")]),
        LogRecord(4.0, 2, [_completed(2, "b")]),
    ]
    audit = audit_log(records)
    assert audit.deposed_events == 2
    assert audit.deposed_batches == 1
    assert audit.enqueued == {"a", "b"}
    assert audit.completions == Counter({"a": 1, "b": 1})
    assert audit.completion_times == [2.0, 4.0]
    assert audit.elected == [(1, 1.0), (2, 2.0)]
    assert audit.first_completed_at == {"a": 2.0, "b": 4.0}


def test_events_of_a_job_the_log_never_enqueued_are_orphans() -> None:
    records = [
        LogRecord(1.0, 1, [_elected(1), _enqueued(1, "a"), _completed(1, "a")]),
        # b's enqueued was in an aborted transaction: its completion is all the log has
        LogRecord(2.0, 1, [_completed(1, "b")]),
    ]
    assert audit_log(records).orphans == {"b"}


def test_a_job_completed_twice_in_the_log_is_seen() -> None:
    records = [
        LogRecord(1.0, 1, [_elected(1), _enqueued(1, "a"), _completed(1, "a")]),
        LogRecord(2.0, 2, [_elected(2), _completed(2, "a")]),
    ]
    assert audit_log(records).completions["a"] == 2


def test_first_after_is_the_earliest_at_or_after_the_moment() -> None:
    assert first_after([5.0, 1.0, 3.0], 2.0) == 3.0
    assert first_after([5.0, 1.0, 3.0], 3.0) == 3.0
    assert first_after([1.0], 2.0) is None


def _start(job_id: str, pid: int, running: int, slots: int = 2) -> dict[str, object]:
    return {"e": "start", "id": job_id, "attempt": 1, "pid": pid, "t": 0.0,
            "running": running, "slots": slots}  # fmt: skip


def _end(job_id: str, pid: int, at: float, outcome: str = "ok") -> dict[str, object]:
    return {"e": "end", "id": job_id, "attempt": 1, "pid": pid, "t": at, "outcome": outcome}


def test_runs_to_success_twice_are_counted_unless_a_worker_kill_explains_them() -> None:
    lines = [
        _start("a", 10, 1), _end("a", 10, 1.0), _start("a", 11, 1), _end("a", 11, 9.0),
        _start("b", 10, 1), _end("b", 10, 2.0), _start("b", 12, 1), _end("b", 12, 8.0),
        _start("c", 11, 1), _end("c", 11, 3.0, "retry"), _start("c", 11, 1), _end("c", 11, 4.0),
    ]  # fmt: skip
    # pid 10 was killed at 3.0: b's success at 2.0 may not have been settled; a's at 1.0 too.
    audit = audit_runs(lines, killed={10: 3.0})
    assert audit.twice == []
    assert audit.twice_after_worker_kill == ["a", "b"]
    assert audit.successes == {"a": 2, "b": 2, "c": 1}
    # Without the kill both are unexplained.
    assert audit_runs(lines, killed={}).twice == ["a", "b"]
    # A kill long after the first success does not explain the second.
    assert audit_runs(lines, killed={10: 60.0}).twice == ["a", "b"]


def test_slot_overruns_are_starts_beyond_the_declared_slots() -> None:
    lines = [_start("a", 1, 1), _start("b", 1, 2), _start("c", 1, 3), _start("d", 2, 1)]
    audit = audit_runs(lines, killed={})
    assert audit.overruns == 1
    assert audit.max_running == {1: 3, 2: 1}
    assert audit.started == 4


def test_lost_wrong_unexpected_and_disagreeing_jobs() -> None:
    statuses: dict[str, str | None] = {"a": "succeeded", "b": "running", "c": None, "d": "dead"}
    assert lost_jobs(["a", "b", "c", "d"], statuses) == ["b", "c"]
    expected = {"a": "succeeded", "d": "succeeded", "b": "succeeded"}
    assert wrong_states(expected, statuses) == ["d"]
    assert unexpected_jobs({"a", "x"}, {"a", "b"}) == ["x"]
    assert disagreements(statuses, {"a": "succeeded", "d": "succeeded"}, ["a", "d", "b"]) == [
        "b",
        "d",
    ]


def _fault(
    kind: str, canary_s: float | None, status: str | None = "succeeded", recovered_s: float = 5.0
) -> FaultRecord:
    fault = FaultRecord(kind, 1.0, 100.0, "x", recovered_s=recovered_s)
    fault.canary_s, fault.canary_status = canary_s, status
    return fault


def test_a_slow_canary_fails_the_run_only_after_a_plain_kill() -> None:
    slow = CANARY_BOUND_S + 1
    assert canary_failures([_fault("leader", 3.0), _fault("worker", 9.9)]) == []
    assert len(canary_failures([_fault("leader", slow)])) == 1
    assert len(canary_failures([_fault("streaming", None, "error: Unavailable")])) == 1
    assert canary_failures([_fault("broker", slow), _fault("pause", slow)]) == []


def test_the_verdict_lists_nonzero_and_unmeasured_safety_counts() -> None:
    assert verdict({"lost": 0, "unexpected": 0}, []) == []
    reasons = verdict({"lost": 2, "delta_api_disagreements": None}, [_fault("leader", 30.0)])
    assert reasons[0] == "lost: 2"
    assert reasons[1] == "delta_api_disagreements: not measured"
    assert "canary took 30.0 s" in reasons[2]


def test_a_fault_the_stack_never_recovered_from_fails_the_run() -> None:
    # The fold restarted after its kill, then exited at once: the canary had already gone
    # through the leader, and nothing else would have said the work stopped reaching Delta.
    dead = _fault("streaming", 0.3)
    dead.recovered_s, dead.note = None, "the restarted fold exited with code 1"
    assert verdict({"lost": 0}, [_fault("broker", 3.0), dead]) == [
        "fault 2 (streaming): never recovered (the restarted fold exited with code 1)"
    ]


def test_faults_are_spread_evenly_inside_the_load() -> None:
    assert fault_times(3, 40.0) == [10.0, 20.0, 30.0]
    assert fault_times(0, 40.0) == []


def test_the_fault_list_is_parsed_and_checked() -> None:
    assert parse_faults("leader, worker,pause") == ("leader", "worker", "pause")
    with pytest.raises(Exception, match="unknown faults"):
        parse_faults("leader,meteor")


def test_a_stall_job_that_ran_across_an_outage_may_succeed_but_no_other() -> None:
    kill = FaultRecord("leader", at_s=10.0, killed_at=1000.0, target="node", recovered_s=4.0)
    worker = FaultRecord("worker", at_s=30.0, killed_at=1020.0, target="w", recovered_s=0.1)
    windows = outage_windows([kill, worker])
    assert windows == [(1000.0, 1009.0)]  # the worker kill is no outage; 5 s to reconnect
    lines = [
        {"e": "start", "id": "across", "attempt": 2, "t": 999.0},
        {"e": "end", "id": "across", "attempt": 2, "t": 1001.5},
        {"e": "start", "id": "before", "attempt": 2, "t": 990.0},
        {"e": "end", "id": "before", "attempt": 2, "t": 992.5},
    ]
    across = ran_across_an_outage(lines, windows)
    assert across == {"across"}
    expected = {"across": "dead", "before": "dead", "ok": "succeeded"}
    statuses = {"across": "succeeded", "before": "succeeded", "ok": "dead"}
    assert wrong_states(expected, statuses, across) == ["before", "ok"]
    assert wrong_states(expected, statuses) == ["across", "before", "ok"]

"""Fidelity of the replay for jobs a client or the limits end: a recorded run (the leader loop
of `recording.py`) with retries, an expiry, a cancel of a queued job, cancels of running jobs
(the worker stops; the worker ignores it and its grace passes; it completes anyway) and an
attempt stopped by its hard time limit, an exec pattern paused, resumed and paused again and
a client paused and resumed while jobs wait (and one runs on, reporting its progress),
replayed under the settings it ran under on the recorded fleet, gives every job's events
again: the same types, at the same times, for the same attempts, with the same reasons; and
the pauses and resumes again, at their times."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from dispatch.core.commands import SubmitRequest
from dispatch.core.events import Event, JobEvent, JobHeartbeat, Paused, Resumed
from dispatch.replay.fleet import recorded_fleet
from dispatch.replay.history import recorded_history
from dispatch.replay.model import History, Outcome, RecordedControl
from dispatch.replay.overrides import apply_overrides
from dispatch.replay.run import ReplayRequest, fleet_for, replay_history
from dispatch.replay.simulation import simulate
from dispatch.settings import DispatcherSettings
from tests.unit.replay.recording import (
    CANCEL_REASON,
    CANCELLED_BY,
    START,
    Behaviour,
    PlannedControl,
    PlannedJob,
    job_mix,
    record_run,
)

SETTINGS = DispatcherSettings(
    ack_timeout_s=10.0,
    max_ack_timeout_s=40.0,
    default_cap=100,
    caps={"acme": 6},
    cancel_grace_s=1.0,
    max_run_by_exec={"report.>": 6.0},
)


def planned(
    at_s: float,
    job_id: str,
    exec_name: str,
    attempts: tuple[Behaviour, ...],
    *,
    cancel_at_s: float | None = None,
    stop_s: float | None = None,
    **extra: Any,
) -> PlannedJob:
    client_id = extra.pop("client_id", "ctl")
    request = SubmitRequest(id=job_id, exec=exec_name, payload=None, client_id=client_id, **extra)
    cancel_at = None if cancel_at_s is None else START + cancel_at_s
    return PlannedJob(START + at_s, request, attempts, cancel_at, stop_s)


def controlled_jobs() -> list[PlannedJob]:
    """Four long jobs fill the image workers' four slots a while, then the jobs a cancel, an
    expiry or a limit ends, and a retried one."""
    busy = [
        planned(1.0 + n * 0.01, f"busy-{n}", "image.resize", (Behaviour(3.0, "ack"),))
        for n in range(4)
    ]
    return [
        *busy,
        # No slot frees before its expiry: it never runs.
        planned(1.1, "late", "image.resize", (Behaviour(0.1, "ack"),), ttl_s=0.5),
        # Cancelled while it waits for a slot.
        planned(1.2, "waiting", "image.resize", (Behaviour(0.1, "ack"),), cancel_at_s=1.5),
        # Running on the demo worker: its worker stops it 0.3 s after the cancel reaches it.
        planned(
            2.0, "stopped", "demo.long", (Behaviour(10.0, "ack"),), cancel_at_s=3.0, stop_s=0.3
        ),
        # Running on the demo worker, which ignores the cancel: the grace (1 s) ends it.
        planned(
            2.1, "ignored", "demo.long", (Behaviour(10.0, "ack"),), cancel_at_s=3.2, max_run_s=30.0
        ),
        # Cancelled while running, but it completes before its grace is over.
        planned(4.5, "finished", "image.resize", (Behaviour(0.4, "ack"),), cancel_at_s=4.8),
        # Its own 1.5 s limit ends its first attempt (retried), then its last one (dead).
        planned(
            5.0, "limited", "video.encode", (Behaviour(4.0, "ack"),), max_run_s=1.5, max_attempts=2
        ),
        # Its exec's default limit (6 s) ends its first attempt; its second one completes.
        planned(5.5, "slow-report", "report.build", (Behaviour(9.0, "ack"), Behaviour(1.0, "ack"))),
        # Retried after a failure, then done.
        planned(6.0, "flaky", "demo.flaky", (Behaviour(0.1, "fail"), Behaviour(0.2, "ack"))),
        # Runs on while its exec is paused, reporting its progress every 0.5 s.
        planned(6.5, "progressing", "batch.nightly", (Behaviour(2.5, "ack", 0.5),)),
        # Submitted while `batch.*` is paused: starts at its resume.
        planned(7.2, "held", "batch.nightly", (Behaviour(0.3, "ack"),)),
        # Its client is paused: starts when the client is resumed.
        planned(7.6, "held-client", "image.resize", (Behaviour(0.3, "ack"),), client_id="tx"),
        # Submitted while `batch.*` is paused the second time.
        planned(9.1, "held-again", "batch.weekly", (Behaviour(0.2, "ack"),)),
    ]


def planned_controls() -> list[PlannedControl]:
    return [
        PlannedControl(START + 7.0, True, "exec", "batch.*", "bad deploy"),
        PlannedControl(START + 7.5, True, "client", "tx"),
        PlannedControl(START + 8.0, False, "exec", "batch.*"),
        PlannedControl(START + 8.5, False, "client", "tx"),
        PlannedControl(START + 9.0, True, "exec", "batch.*", "again"),
        PlannedControl(START + 10.0, False, "exec", "batch.*"),
    ]


def record_controlled(jobs: list[PlannedJob] | None = None) -> list[Event]:
    """The controlled jobs (or `jobs`) run with the planned pauses and resumes."""
    chosen = controlled_jobs() if jobs is None else jobs
    return record_run(chosen, SETTINGS, controls=planned_controls())


def controls_of(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    """The pauses and resumes as (type, time, scope, target, by, reason)."""
    return [
        (e.type, round(e.at, 6), e.scope.value, e.target, e.by, getattr(e, "reason", None))
        for e in events
        if isinstance(e, Paused | Resumed)
    ]


def per_job(events: Sequence[Event], only: frozenset[str] | None = None) -> dict[str, list[Any]]:
    """Each job's events as (type, time, attempt, reason, worker, by) in order."""
    out: dict[str, list[Any]] = {}
    for event in events:
        if not isinstance(event, JobEvent) or (only is not None and event.job_id not in only):
            continue
        out.setdefault(event.job_id, []).append(
            (
                event.type,
                round(event.at, 6),
                getattr(event, "attempt", None),
                str(getattr(event, "reason", "")),
                getattr(event, "worker_id", None),
                getattr(event, "by", None),
            )
        )
    return out


@pytest.fixture(scope="module")
def recorded() -> list[Event]:
    return record_controlled()


@pytest.fixture(scope="module")
def history(recorded: list[Event]) -> History:
    return recorded_history(recorded)


def test_the_recording_has_every_kind_of_ending(recorded: list[Event]) -> None:
    jobs = per_job(recorded)
    ends = {job_id: [step[0] for step in steps] for job_id, steps in jobs.items()}
    assert ends["late"] == ["enqueued", "expired"]
    assert ends["waiting"] == ["enqueued", "cancelled"]
    assert ends["stopped"] == ["enqueued", "assigned", "cancel_requested", "cancelled"]
    assert ends["ignored"] == ["enqueued", "assigned", "cancel_requested", "cancelled"]
    assert ends["finished"] == ["enqueued", "assigned", "cancel_requested", "completed"]
    assert ends["limited"] == ["enqueued", "assigned", "requeued", "assigned", "dead_lettered"]
    assert ends["slow-report"] == ["enqueued", "assigned", "requeued", "assigned", "completed"]
    assert ends["flaky"] == ["enqueued", "assigned", "requeued", "assigned", "completed"]
    assert jobs["limited"][2][3] == jobs["limited"][4][3] == "time_limit"
    assert jobs["stopped"][2][5] == CANCELLED_BY
    # The pauses hold what is queued, from their start to their resume; a running job goes
    # on, and its progress reports are logged (at most one a second: some are dropped).
    controls = controls_of(recorded)
    assert [(c[0], c[2], c[3]) for c in controls] == [
        ("paused", "exec", "batch.*"), ("paused", "client", "tx"),
        ("resumed", "exec", "batch.*"), ("resumed", "client", "tx"),
        ("paused", "exec", "batch.*"), ("resumed", "exec", "batch.*"),
    ]  # fmt: skip
    resumes = [c[1] for c in controls if c[0] == "resumed"]
    assert jobs["held"][1][:2] == ("assigned", resumes[0])
    assert jobs["held-client"][1][:2] == ("assigned", resumes[1])
    assert jobs["held-again"][1][:2] == ("assigned", resumes[2])
    assert ends["progressing"][-1] == "completed"
    reports = [
        e.progress for e in recorded if isinstance(e, JobHeartbeat) and e.job_id == "progressing"
    ]
    assert any(report is not None for report in reports)
    assert any(report is None for report in reports), "a report too soon is left out"


def test_the_history_reads_each_ending(history: History) -> None:
    jobs = {job.job_id: job for job in history.jobs}
    stopped, ignored = jobs["stopped"], jobs["ignored"]
    assert [a.outcome for a in stopped.attempts] == [Outcome.CANCELLED]
    assert stopped.cancelled_at == pytest.approx(START + 3.0, abs=0.03)
    assert (stopped.cancel_by, stopped.cancel_reason) == (CANCELLED_BY, CANCEL_REASON)
    assert stopped.cancel_stop_s is not None and 0.3 < stopped.cancel_stop_s < 0.35
    assert [a.outcome for a in ignored.attempts] == [Outcome.STALLED]
    assert ignored.cancel_stop_s is None and ignored.max_run_s == 30.0
    assert [a.outcome for a in jobs["finished"].attempts] == [Outcome.COMPLETED]
    assert [a.outcome for a in jobs["limited"].attempts] == [Outcome.TIME_LIMIT] * 2
    assert jobs["limited"].max_run_s == 1.5
    assert jobs["slow-report"].max_run_s == 6.0  # its exec's default, as enqueued
    assert [a.outcome for a in jobs["slow-report"].attempts] == [
        Outcome.TIME_LIMIT,
        Outcome.COMPLETED,
    ]
    assert jobs["late"].expires_at is not None and not jobs["late"].attempts
    assert jobs["waiting"].cancelled_at is not None and not jobs["waiting"].attempts
    pauses = [c for c in history.controls if isinstance(c, RecordedControl)]
    assert len(pauses) == len(history.controls)
    assert [(c.pause, c.scope, c.target, c.by) for c in pauses] == [
        (True, "exec", "batch.*", CANCELLED_BY), (True, "client", "tx", CANCELLED_BY),
        (False, "exec", "batch.*", CANCELLED_BY), (False, "client", "tx", CANCELLED_BY),
        (True, "exec", "batch.*", CANCELLED_BY), (False, "exec", "batch.*", CANCELLED_BY),
    ]  # fmt: skip
    assert history.controls[0].reason == "bad deploy"
    assert len(jobs["progressing"].attempts[0].heartbeats) >= 3


def test_the_replay_gives_every_jobs_recorded_events_again(
    recorded: list[Event], history: History
) -> None:
    policy = apply_overrides(SETTINGS, ())
    result = simulate(
        history.jobs,
        recorded_fleet(history),
        policy,
        recorded_under=SETTINGS,
        iterations=history.instants,
        controls=history.controls,
    )
    actual = per_job(history.events)
    replayed = per_job(result.events)
    assert set(replayed) == set(actual)
    different = {job_id: (actual[job_id], replayed[job_id]) for job_id in actual}
    different = {job_id: pair for job_id, pair in different.items() if pair[0] != pair[1]}
    assert different == {}
    assert controls_of(result.events) == controls_of(recorded)
    report = replay_history(
        history, policy, fleet_for(ReplayRequest(), history), recorded_under=SETTINGS
    )
    everything = report.groups[0]
    assert everything.actual == everything.simulated


def test_a_job_s_own_limit_is_kept_and_a_default_one_follows_a_what_if(history: History) -> None:
    """`--set dispatcher.max_run_by_exec...`: the report job's limit was its exec's default,
    so a longer one applies to it (how long its first attempt would have run is unknown: it
    never answers, and its ack timeout ends it); the video job's own limit stays."""
    policy = apply_overrides(SETTINGS, ['dispatcher.max_run_by_exec={"report.>": 20}'])
    result = simulate(
        history.jobs, recorded_fleet(history), policy, recorded_under=SETTINGS,
        iterations=history.instants, controls=history.controls,
    )  # fmt: skip
    replayed = per_job(result.events)
    assert replayed["limited"] == per_job(history.events)["limited"]
    report_steps = [(step[0], step[3]) for step in replayed["slow-report"]]
    assert ("requeued", "time_limit") not in report_steps
    assert ("requeued", "timeout") in report_steps


def test_what_if_pauses_hold_or_free_what_they_name(history: History) -> None:
    """`--set dispatcher.pause.exec.batch.*=false`: the recorded pauses of `batch.*` are left
    out, so its held jobs start when submitted; `dispatcher.pause.client.tx=true`: the
    client is held for the whole replay, its job never starts (the client's own recorded
    pause and resume are left out too)."""
    policy = apply_overrides(
        SETTINGS, ["dispatcher.pause.exec.batch.*=false", "dispatcher.pause.client.tx=true"]
    )
    result = simulate(
        history.jobs, recorded_fleet(history), policy, recorded_under=SETTINGS,
        iterations=history.instants, controls=history.controls,
    )  # fmt: skip
    replayed = per_job(result.events)
    jobs = {job.job_id: job for job in history.jobs}
    for job_id in ("held", "held-again"):
        assert replayed[job_id][1][0] == "assigned"
        assert replayed[job_id][1][1] < round(jobs[job_id].submitted_at + 0.05, 6)
    assert [step[0] for step in replayed["held-client"]] == ["enqueued"]
    assert [(c[0], c[2], c[3]) for c in controls_of(result.events)] == [("paused", "client", "tx")]


def test_jobs_of_a_mix_with_controls_replay_to_the_same_outcomes() -> None:
    """The demo mix plus the controlled jobs: every job ends the same way in the replay."""
    jobs = sorted([*job_mix(seed=3, duration_s=20.0), *controlled_jobs()], key=lambda j: j.at)
    history = recorded_history(record_controlled(jobs))
    policy = apply_overrides(SETTINGS, ())
    result = simulate(
        history.jobs, recorded_fleet(history), policy, recorded_under=SETTINGS,
        iterations=history.instants, controls=history.controls,
    )  # fmt: skip
    endings = {"completed", "dead_lettered", "cancelled", "expired"}

    def ends(events: Sequence[Event]) -> dict[str, str]:
        return {e.job_id: e.type for e in events if isinstance(e, JobEvent) and e.type in endings}

    assert ends(result.events) == ends(history.events)

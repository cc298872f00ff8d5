"""Fidelity of the replay for jobs limits hold: a recorded run (the leader loop of
`recording.py`) under a settings' key limit (`account:*`, one at a time per account), with
runtime limits set, loosened and removed on an exec pattern and a rate limit on a client,
replayed under the settings it ran under on the recorded fleet, gives every job's events
again (the same types, at the same times, on the same workers) and the limits again, at their
times; `--set dispatcher.limits...` what-ifs change what they name and leave the recorded
runtime limits of that target out."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from dispatch.core.commands import SubmitRequest
from dispatch.core.events import Assigned, Completed, Event, LimitRemoved, LimitSet
from dispatch.replay.fleet import recorded_fleet
from dispatch.replay.history import recorded_history
from dispatch.replay.model import History, RecordedLimit
from dispatch.replay.overrides import apply_overrides
from dispatch.replay.run import ReplayRequest, fleet_for, replay_history
from dispatch.replay.simulation import simulate
from dispatch.settings import DispatcherSettings
from tests.unit.replay.recording import (
    CANCELLED_BY,
    START,
    Behaviour,
    PlannedJob,
    PlannedLimit,
    record_run,
)
from tests.unit.replay.test_controls_fidelity import per_job

SETTINGS = DispatcherSettings(
    ack_timeout_s=4.0,
    max_attempts=3,
    retry_delay_s=0.5,
    retry_jitter=0.0,
    default_cap=100,
    limits={"key": {"account:*": {"max_inflight": 1}}},
)


def job(at_s: float, job_id: str, exec_name: str, run_s: float, **extra: Any) -> PlannedJob:
    client_id = extra.pop("client_id", "lim")
    request = SubmitRequest(id=job_id, exec=exec_name, payload=None, client_id=client_id, **extra)
    return PlannedJob(START + at_s, request, (Behaviour(run_s, "ack"),))


def limited_jobs() -> list[PlannedJob]:
    return [
        # One account's jobs run one at a time (the settings' `account:*` limit), another
        # account's beside them.
        job(0.5, "k1", "ledger.post", 0.4, key="account:7"),
        job(0.6, "k2", "ledger.post", 0.4, key="account:7"),
        job(0.7, "k3", "ledger.post", 0.4, key="account:7"),
        job(0.8, "k4", "ledger.post", 0.4, key="account:8"),
        # `render.*` limited to one at a time, then two, then not at all.
        *(job(1.2 + 0.1 * n, f"r{n}", "render.frame", 0.9) for n in range(5)),
        # A client limited to 2 starts a second (burst 1).
        *(job(0.3, f"b{n}", "mail.send", 0.1, client_id="bulk") for n in range(5)),
    ]


def planned_limits() -> list[PlannedLimit]:
    return [
        PlannedLimit(START + 0.2, "client", "bulk", {"rate": 2.0, "burst": 1}, "bulk mail"),
        PlannedLimit(START + 1.0, "exec", "render.*", {"max_inflight": 1}, "one gpu"),
        PlannedLimit(START + 2.5, "exec", "render.*", {"max_inflight": 2}, "two gpus"),
        PlannedLimit(START + 3.6, "exec", "render.*"),
        PlannedLimit(START + 3.0, "client", "bulk"),
    ]


def limits_of(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    """The limits set and removed as (type, time, scope, target, knobs, by, reason)."""
    out: list[tuple[Any, ...]] = []
    for e in events:
        if isinstance(e, LimitSet):
            knobs = (e.max_inflight, e.rate, e.burst)
            out.append((e.type, round(e.at, 6), e.scope.value, e.target, knobs, e.by, e.reason))
        elif isinstance(e, LimitRemoved):
            out.append((e.type, round(e.at, 6), e.scope.value, e.target, None, e.by, None))
    return out


def record_limited() -> list[Event]:
    return record_run(limited_jobs(), SETTINGS, controls=planned_limits())


@pytest.fixture(scope="module")
def recorded() -> list[Event]:
    return record_limited()


@pytest.fixture(scope="module")
def history(recorded: list[Event]) -> History:
    return recorded_history(recorded)


def starts(events: Sequence[Event]) -> dict[str, float]:
    return {e.job_id: e.at for e in events if isinstance(e, Assigned) and e.attempt == 1}


def ends(events: Sequence[Event]) -> dict[str, float]:
    return {e.job_id: e.at for e in events if isinstance(e, Completed)}


def running_at_once(events: Sequence[Event], chosen: set[str]) -> int:
    """The most of `chosen` jobs running at once."""
    changes = sorted(
        [(at, 1) for job_id, at in starts(events).items() if job_id in chosen]
        + [(at, -1) for job_id, at in ends(events).items() if job_id in chosen]
    )
    most = running = 0
    for _, change in changes:
        running += change
        most = max(most, running)
    return most


def test_the_recording_is_held_by_its_limits(recorded: list[Event]) -> None:
    started = starts(recorded)
    assert running_at_once(recorded, {"k1", "k2", "k3"}) == 1
    assert started["k4"] < started["k2"], "another account is not held"
    renders = sorted(started[f"r{n}"] for n in range(5))
    assert running_at_once(recorded, {f"r{n}" for n in range(5)}) == 2
    assert renders[1] > START + 2.0, "one at a time until the limit is loosened"
    bulk = sorted(started[f"b{n}"] for n in range(5))
    gaps = [later - earlier for earlier, later in itertools.pairwise(bulk)]
    assert min(gaps) >= 0.5 - 1e-6, "two starts a second"
    assert [(e[0], e[2], e[3]) for e in limits_of(recorded)] == [
        ("limit_set", "client", "bulk"), ("limit_set", "exec", "render.*"),
        ("limit_set", "exec", "render.*"), ("limit_removed", "client", "bulk"),
        ("limit_removed", "exec", "render.*"),
    ]  # fmt: skip


def test_the_history_reads_the_limits_and_the_keys(history: History) -> None:
    jobs = {job.job_id: job for job in history.jobs}
    assert jobs["k1"].key == "account:7" and jobs["r0"].key is None
    limits = [c for c in history.controls if isinstance(c, RecordedLimit)]
    assert len(limits) == len(history.controls) == 5
    first = limits[0]
    assert (first.set, first.scope, first.target, first.rate, first.burst) == (
        True, "client", "bulk", 2.0, 1,
    )  # fmt: skip
    assert (first.by, first.reason, first.max_inflight) == (CANCELLED_BY, "bulk mail", None)
    assert (limits[4].set, limits[4].target, limits[4].by) == (False, "render.*", CANCELLED_BY)


def test_the_replay_gives_every_jobs_recorded_events_again(
    recorded: list[Event], history: History
) -> None:
    policy = apply_overrides(SETTINGS, ())
    result = simulate(
        history.jobs, recorded_fleet(history), policy, recorded_under=SETTINGS,
        iterations=history.instants, controls=history.controls,
    )  # fmt: skip
    actual = per_job(history.events)
    replayed = per_job(result.events)
    different = {job_id: (actual[job_id], replayed.get(job_id)) for job_id in actual}
    different = {job_id: pair for job_id, pair in different.items() if pair[0] != pair[1]}
    assert different == {}
    assert limits_of(result.events) == limits_of(recorded)
    report = replay_history(
        history, policy, fleet_for(ReplayRequest(), history), recorded_under=SETTINGS
    )
    assert report.groups[0].actual == report.groups[0].simulated


def test_what_if_limits_change_what_they_name(history: History) -> None:
    """`--set dispatcher.limits.exec.render.*.max_inflight=5`: the recorded runtime limits of
    `render.*` are left out and five may run, so they start sooner, as slots allow;
    `dispatcher.limits.key.account:*=null`: the accounts are not limited; the client's
    recorded rate limit is still replayed."""
    policy = apply_overrides(
        SETTINGS,
        ["dispatcher.limits.exec.render.*.max_inflight=5", "dispatcher.limits.key.account:*=null"],
    )
    result = simulate(
        history.jobs, recorded_fleet(history), policy, recorded_under=SETTINGS,
        iterations=history.instants, controls=history.controls,
    )  # fmt: skip
    started, recorded = starts(result.events), starts(history.events)
    jobs = {job.job_id: job for job in history.jobs}
    renders = {f"r{n}" for n in range(5)}
    for job_id in renders:
        assert started[job_id] <= recorded[job_id] + 1e-6
    assert started["r1"] < jobs["r1"].submitted_at + 0.05, "not held behind r0"
    assert running_at_once(result.events, renders) > 2
    assert running_at_once(result.events, {"k1", "k2", "k3"}) == 3
    assert [(e[0], e[3]) for e in limits_of(result.events)] == [
        ("limit_set", "bulk"), ("limit_removed", "bulk"),
    ]  # fmt: skip
    assert running_at_once(result.events, {f"b{n}" for n in range(5)}) == 1


def test_a_what_if_rate_limit_spaces_a_client_s_starts(history: History) -> None:
    """`--set dispatcher.limits.client.lim.rate=1`: the `lim` client's jobs start at most
    one a second (burst 1) for the whole replay."""
    policy = apply_overrides(SETTINGS, ["dispatcher.limits.client.lim.rate=1"])
    result = simulate(
        history.jobs, recorded_fleet(history), policy, recorded_under=SETTINGS,
        iterations=history.instants, controls=history.controls,
    )  # fmt: skip
    lim = sorted(at for job_id, at in starts(result.events).items() if not job_id.startswith("b"))
    assert len(lim) == 9
    gaps = [later - earlier for earlier, later in itertools.pairwise(lim)]
    assert min(gaps) >= 1.0 - 1e-6

"""The virtual-clock replay around the pure core."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dispatch.core.events import Assigned, Event, Expired, Requeued
from dispatch.replay.fleet import FleetWorker, uniform_fleet
from dispatch.replay.model import Attempt, Outcome, RecordedJob
from dispatch.replay.overrides import apply_overrides
from dispatch.replay.report import ALL, CLIENT, figures_by_group
from dispatch.replay.simulation import simulate, submit_request
from dispatch.settings import DispatcherSettings

RAN_UNDER = DispatcherSettings(ack_timeout_s=60.0, max_ack_timeout_s=600.0)


def jobs(
    count: int,
    run_s: float = 1.0,
    client: str = "acme",
    start: float = 1000.0,
    gap_s: float = 0.1,
    outcome: Outcome = Outcome.COMPLETED,
) -> list[RecordedJob]:
    return [
        RecordedJob(
            f"{client}-{n}",
            client,
            "image.resize",
            start + n * gap_s,
            0,
            5,
            60.0,
            None,
            (Attempt(run_s, outcome),),
        )
        for n in range(count)
    ]


def run(
    work: Sequence[RecordedJob], fleet: Sequence[FleetWorker], *sets: str, seed: int = 0
) -> list[Event]:
    policy = apply_overrides(RAN_UNDER, sets)
    return list(simulate(work, fleet, policy, recorded_under=RAN_UNDER, seed=seed).events)


def wait_p95(events: Sequence[Event], group: tuple[str, str] = (ALL, ALL)) -> float:
    value = figures_by_group(events)[group].queue_wait_p95_s
    assert value is not None
    return value


def test_the_same_input_and_settings_give_the_same_events() -> None:
    work = jobs(200) + jobs(100, client="globex", gap_s=0.15)
    fleet = uniform_fleet(3, 2)
    assert run(work, fleet, "dispatcher.caps.acme=3") == run(work, fleet, "dispatcher.caps.acme=3")


def test_a_day_of_jobs_replays_to_the_end_on_the_virtual_clock() -> None:
    work = jobs(2000, run_s=30.0, gap_s=43.2)  # one job every 43 s for a day
    events = run(work, uniform_fleet(1, 1))
    figures = figures_by_group(events)[ALL, ALL]
    assert (figures.jobs, figures.completed) == (2000, 2000)
    assert events[-1].at == work[-1].submitted_at + 30.0


def test_more_workers_shorten_the_queue() -> None:
    work = jobs(300)
    assert wait_p95(run(work, uniform_fleet(8, 2))) < wait_p95(run(work, uniform_fleet(2, 2)))


def test_a_tenant_cap_holds_its_jobs_back_and_lets_the_others_through() -> None:
    work = sorted(jobs(200) + jobs(40, client="globex", gap_s=0.5), key=lambda j: j.submitted_at)
    fleet = uniform_fleet(4, 4)
    free = run(work, fleet)
    capped = run(work, fleet, "dispatcher.caps.acme=2")
    assert wait_p95(capped, (CLIENT, "acme")) > 2 * wait_p95(free, (CLIENT, "acme"))
    assert wait_p95(capped, (CLIENT, "globex")) <= wait_p95(free, (CLIENT, "globex"))


def test_a_shorter_ack_timeout_retries_slow_jobs_until_they_dead_letter() -> None:
    work = jobs(10, run_s=3.0)
    fleet = uniform_fleet(10, 1)
    kept = figures_by_group(run(work, fleet))[ALL, ALL]
    short = figures_by_group(
        run(
            work,
            fleet,
            "dispatcher.ack_timeout_s=1",
            "dispatcher.backoff_multiplier=1",
            "dispatcher.max_attempts=2",
        )
    )[ALL, ALL]
    assert (kept.completed, kept.attempts, kept.dead_lettered) == (10, 10, 0)
    assert short.dead_lettered == 10
    assert short.attempts == 20


def test_failures_are_retried_and_permanent_ones_dead_letter() -> None:
    flaky = jobs(5, run_s=0.1, outcome=Outcome.FAILED)
    doomed = jobs(3, run_s=0.1, client="globex", outcome=Outcome.FAILED_PERMANENT)
    figures = figures_by_group(run(flaky + doomed, uniform_fleet(2, 2)))
    assert figures[CLIENT, "acme"].attempts == 25  # five attempts each, then retries exhausted
    assert figures[CLIENT, "acme"].dead_lettered == 5
    assert (figures[CLIENT, "globex"].attempts, figures[CLIENT, "globex"].dead_lettered) == (3, 3)


def test_a_worker_that_leaves_gives_its_jobs_back_and_they_run_elsewhere() -> None:
    work = jobs(4, run_s=10.0, gap_s=0.0)
    fleet = [
        FleetWorker("leaves", ("job.assign.>",), 4, leaves_at=1005.0),
        FleetWorker("late", ("job.assign.>",), 4, joins_at=1020.0),
    ]
    events = run(work, fleet)
    finished = [e for e in events if e.type == "completed"]
    assert {e.worker_id for e in finished} == {"late"}  # type: ignore[attr-defined]
    assert min(e.at for e in finished) == 1030.0


def test_a_default_value_follows_the_new_default_and_a_jobs_own_value_stays() -> None:
    policy = apply_overrides(RAN_UNDER, ["dispatcher.max_attempts=2"])
    defaulted, own = (
        RecordedJob(job_id, "acme", "x.y", 0.0, 0, attempts, 60.0, None, ())
        for job_id, attempts in (("d", 5), ("o", 9))
    )
    assert submit_request(defaulted, policy, RAN_UNDER).max_attempts is None
    assert submit_request(own, policy, RAN_UNDER).max_attempts == 9


def test_recorded_heartbeats_keep_a_long_attempt_alive() -> None:
    beating = Attempt(150.0, Outcome.COMPLETED, heartbeats=(50.0, 100.0))
    silent = Attempt(150.0, Outcome.COMPLETED)
    work = [
        RecordedJob(name, "acme", "x.y", 1000.0, 0, 1, 60.0, None, (attempt,))
        for name, attempt in (("beating", beating), ("silent", silent))
    ]
    events = run(work, uniform_fleet(2, 1))
    outcome = {e.job_id: e.type for e in events if e.type in ("completed", "dead_lettered")}  # type: ignore[attr-defined]
    assert outcome == {"beating": "completed", "silent": "dead_lettered"}


def test_a_timer_fires_at_the_recorded_leaders_next_iteration() -> None:
    work = jobs(1, run_s=70.0)  # times out at 1060.0 and waits for the busy slot
    policy = apply_overrides(RAN_UNDER, [])
    fleet = uniform_fleet(1, 1)
    plain = simulate(work, fleet, policy, recorded_under=RAN_UNDER).events
    snapped = simulate(
        work, fleet, policy, recorded_under=RAN_UNDER, iterations=(1059.0, 1060.013, 1070.0)
    ).events
    far = simulate(work, fleet, policy, recorded_under=RAN_UNDER, iterations=(1061.0,)).events
    first_timeout = [
        next(e.at for e in run_ if e.type == "requeued") for run_ in (plain, snapped, far)
    ]
    assert first_timeout == [1060.0, 1060.013, 1060.0]


def _failing_once(job_id: str, retry_after_s: float | None, **fields: Any) -> RecordedJob:
    attempts = (
        Attempt(1.0, Outcome.FAILED, retry_after_s=retry_after_s),
        Attempt(1.0, Outcome.COMPLETED),
    )
    return RecordedJob(job_id, "acme", "image.resize", 1000.0, 0, 5, 60.0, None, attempts, **fields)


def _retry_times(events: Sequence[Event]) -> dict[str, tuple[float, float | None]]:
    """Each job's first requeue: (its time, the retry time it was given)."""
    out: dict[str, tuple[float, float | None]] = {}
    for event in events:
        if isinstance(event, Requeued) and event.job_id not in out:
            out[event.job_id] = (event.at, event.not_before)
    return out


def test_retry_delays_replay_as_recorded_and_follow_a_what_if() -> None:
    """The policy's delays are those of the settings replayed under; a delay a worker asked
    for is its answer, replayed as it was given."""
    work = [_failing_once("policy", None), _failing_once("asked", 7.0)]
    fleet = uniform_fleet(2, 1)
    for sets, policy_delay in (
        ((), 1.0),
        (("dispatcher.retry_delay_s=30", "dispatcher.retry_jitter=0"), 30.0),
    ):
        events = run(work, fleet, *sets)
        times = _retry_times(events)
        at, not_before = times["asked"]
        assert not_before == at + 7.0
        at, not_before = times["policy"]
        assert not_before is not None and policy_delay * 0.8 <= not_before - at <= policy_delay
        # Each next attempt starts no sooner than its retry time.
        second = {e.job_id: e.at for e in events if isinstance(e, Assigned) and e.attempt == 2}
        assert set(second) == {"policy", "asked"}
        for job_id, started in second.items():
            retry_at = times[job_id][1]
            assert retry_at is not None and started >= retry_at


def test_a_job_that_cannot_start_before_its_expiry_expires_in_the_replay() -> None:
    busy = jobs(3, run_s=50.0)
    late = RecordedJob("late", "acme", "image.resize", 1001.0, 0, 5, 60.0, None,
                       (Attempt(1.0, Outcome.COMPLETED),), expires_at=1010.0)  # fmt: skip
    events = run([*busy, late], uniform_fleet(1, 1))
    assert [e.job_id for e in events if isinstance(e, Expired)] == ["late"]
    assert "late" not in {e.job_id for e in events if isinstance(e, Assigned)}

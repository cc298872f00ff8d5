"""Pause and unpause: an exec pattern's queues or a client's jobs start nothing new."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch.core import (
    Dispatcher,
    InvalidTransition,
    JobRecord,
    JobStatus,
    Paused,
    PauseScope,
    RejectCode,
    Rejected,
    Requeued,
    Resumed,
    check_invariants,
    event_from_dict,
    state_view,
)
from dispatch.core.checks import check_work_conserving
from dispatch.core.control_commands import MAX_PAUSE_REASON
from tests.unit.core.helpers import T0, Run, ack, assigned_ids, assignments, request, types, worker


class PauseRun(Run):
    credits = 10


def _submit(run: Run, job_id: str, exec_name: str, client: str = "acme", now: float = T0) -> Any:
    return run(run.core.submit(request(job_id, exec_name, client_id=client), now))


@pytest.mark.parametrize(
    ("pattern", "held"),
    [
        ("image.*", {"image.resize", "image.crop"}),
        ("image.>", {"image.resize", "image.crop", "image.resize.big"}),
        ("image.resize", {"image.resize"}),
        ("*.resize", {"image.resize"}),
        (">", {"image.resize", "image.crop", "image.resize.big", "mail.send"}),
    ],
)
def test_an_exec_pause_holds_the_matching_queues_only(pattern: str, held: set[str]) -> None:
    run = PauseRun()
    run(worker(run.core, "w", credits=10))
    assert types(run(run.core.pause("exec", pattern, T0, by="ops", reason="deploy"))) == ["paused"]
    execs = ["image.resize", "image.crop", "image.resize.big", "mail.send"]
    started = set()
    for n, exec_name in enumerate(execs):
        if assigned_ids(_submit(run, f"j{n}", exec_name)):
            started.add(exec_name)
    assert started == set(execs) - held
    assert {e for e in execs if run.core.exec_paused(e)} == held
    check_work_conserving(run.core)
    # Submissions are accepted and wait.
    assert {job.exec for job in run.core.jobs() if job.status is JobStatus.QUEUED} == held
    run.check()


def test_a_client_pause_parks_its_jobs_in_every_exec() -> None:
    run = PauseRun()
    run(worker(run.core, "w", credits=0))
    run(run.core.pause("client", "acme", T0))
    assert run.core.client_paused("acme") and not run.core.client_paused("beta")
    for n, exec_name in enumerate(["image.resize", "mail.send", "pdf.render"]):
        _submit(run, f"a{n}", exec_name, "acme")
        _submit(run, f"b{n}", exec_name, "beta")
    started = assigned_ids(run(run.core.grant_credit("w", 10, T0)))
    assert sorted(started) == ["b0", "b1", "b2"]
    check_work_conserving(run.core)
    # Unpause: its jobs start at once.
    events = run(run.core.unpause("client", "acme", T0 + 1, by="ops"))
    assert types(events)[0] == "resumed"
    assert sorted(assigned_ids(events)) == ["a0", "a1", "a2"]
    run.check()


def test_running_jobs_still_settle() -> None:
    run = PauseRun()
    first = run.start("j1")
    second = run.start("j2")
    run(run.core.pause("exec", "image.>", T0))
    run(run.core.heartbeat("j1", 1, first.lease, T0 + 1, progress={"done": 1}))
    assert types(run(ack(run.core, first, T0 + 2))) == ["completed"]
    assert types(run(run.core.fail("j2", 1, second.lease, T0 + 2, error="x"))) == ["requeued"]
    assert run.job("j1").status is JobStatus.SUCCEEDED
    assert run.job("j2").status is JobStatus.QUEUED, "requeued, and not started again"
    run.check()


@pytest.mark.parametrize(("scope", "target"), [("exec", "image.*"), ("client", "acme")])
def test_a_timed_out_attempt_of_a_paused_job_is_requeued(scope: str, target: str) -> None:
    run = PauseRun(ack_timeout_s=10.0)
    run.start("j1", client_id="acme")
    run(worker(run.core, "w2", credits=5, now=T0))
    run(run.core.pause(scope, target, T0 + 1))
    events = run(run.core.tick(T0 + 11))
    assert types(events) == ["requeued"]
    (requeued,) = events
    assert isinstance(requeued, Requeued) and requeued.reason.value == "timeout"
    assert run.job("j1").status is JobStatus.QUEUED
    # The resume starts its next attempt at once.
    events = run(run.core.unpause(scope, target, T0 + 12))
    assert assigned_ids(events) == ["j1"] and assignments(events)[0].attempt == 2
    run.check()


def test_unpause_assigns_at_once_and_only_its_own_pause() -> None:
    run = PauseRun()
    run(worker(run.core, "w", credits=10))
    run(run.core.pause("exec", "image.*", T0))
    run(run.core.pause("exec", "image.>", T0))
    _submit(run, "j1", "image.resize")
    # Resuming image.* leaves image.> in force.
    assert assigned_ids(run(run.core.unpause("exec", "image.*", T0 + 1))) == []
    assert [(p.scope, p.target) for p in run.core.pauses()] == [(PauseScope.EXEC, "image.>")]
    assert assigned_ids(run(run.core.unpause("exec", "image.>", T0 + 2))) == ["j1"]
    assert run.core.pauses() == []
    run.check()


def test_pausing_twice_or_unpausing_what_is_not_paused_answers_nothing() -> None:
    run = PauseRun()
    (first,) = run(run.core.pause("exec", "image.*", T0, by="a", reason="first"))
    assert run.core.pause("exec", "image.*", T0 + 1, by="b", reason="second") == []
    assert run.core.pauses() == [first], "the first pause's key and reason stay"
    assert run.core.unpause("exec", "image.>", T0) == []
    assert run.core.unpause("client", "image.*", T0) == []
    assert run.core.unpause("client", "acme", T0) == []
    assert types(run(run.core.unpause("exec", "image.*", T0))) == ["resumed"]
    assert run.core.unpause("exec", "image.*", T0) == []
    run.check()


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        (("queue", "image.*"), {}, "scope"),
        ((None, "image.*"), {}, "scope"),
        (("exec", "image..resize"), {}, "exec"),
        (("exec", "image.>.x"), {}, "exec"),
        (("exec", "ima*ge"), {}, "exec"),
        (("exec", ""), {}, "exec"),
        (("exec", 7), {}, "exec"),
        (("exec", "a." * 200 + "b"), {}, "exec"),
        (("client", ""), {}, "client_id"),
        (("client", "c" * 1000), {}, "client_id"),
        (("client", None), {}, "client_id"),
        (("exec", "image.*"), {"by": ""}, "by"),
        (("exec", "image.*"), {"by": 5}, "by"),
        (("exec", "image.*"), {"reason": "x" * (MAX_PAUSE_REASON + 1)}, "reason"),
        (("exec", "image.*"), {"reason": None}, "reason"),
    ],
)
def test_a_bad_pause_is_refused_as_invalid(args: Any, kwargs: Any, field: str) -> None:
    run = PauseRun()
    with pytest.raises(Rejected) as caught:
        run.core.pause(args[0], args[1], T0, **kwargs)
    assert caught.value.code is RejectCode.INVALID and field in caught.value.detail
    assert run.core.pauses() == []
    if "reason" not in kwargs:
        with pytest.raises(Rejected) as caught:
            run.core.unpause(args[0], args[1], T0, **kwargs)
        assert caught.value.code is RejectCode.INVALID and field in caught.value.detail


def test_a_queue_created_after_an_exec_pause_is_paused() -> None:
    run = PauseRun()
    run(worker(run.core, "w", credits=10))
    run(run.core.pause("exec", "video.>", T0))
    assert assigned_ids(_submit(run, "j1", "video.encode.hd")) == []
    assert run.core.state._queues["video.encode.hd"].paused
    assert assigned_ids(_submit(run, "j2", "videos.encode")) == ["j2"]
    run.check()


def test_a_client_first_seen_after_its_pause_is_paused() -> None:
    run = PauseRun()
    run(worker(run.core, "w", credits=10))
    run(run.core.pause("client", "newcomer", T0))
    # Nothing is kept for a client only a pause named.
    assert "newcomer" not in run.core.state._clients
    assert assigned_ids(_submit(run, "j1", "image.resize", "newcomer")) == []
    assert assigned_ids(_submit(run, "j2", "image.resize", "other")) == ["j2"]
    assert assigned_ids(run(run.core.unpause("client", "newcomer", T0 + 1))) == ["j1"]
    run.check()


def test_a_resumed_unknown_client_leaves_no_state() -> None:
    run = PauseRun()
    for n in range(5):
        run(run.core.pause("client", f"ghost-{n}", T0))
        run(run.core.unpause("client", f"ghost-{n}", T0))
    assert run.core.state._clients == {}
    run.check()


def _paused_scenario() -> tuple[Run, list[Paused]]:
    run = PauseRun()
    run(worker(run.core, "w", credits=2))
    for n, (exec_name, client) in enumerate(
        [("image.resize", "acme"), ("mail.send", "acme"), ("mail.send", "beta"), ("pdf.x", "c")] * 2
    ):
        _submit(run, f"j{n}", exec_name, client)
    run(run.core.pause("exec", "mail.*", T0 + 1, reason="smtp down"))
    run(run.core.pause("client", "acme", T0 + 2))
    return run, run.core.pauses()


def test_restore_with_the_pauses_assigns_as_the_live_core() -> None:
    run, pauses = _paused_scenario()
    assert [p.target for p in pauses] == ["mail.*", "acme"]
    restored = Dispatcher.restore(
        [JobRecord.from_dict(job.to_dict()) for job in run.core.jobs()],
        config=run.core.config,
        workers=run.core.workers(),
        pauses=pauses,
    )
    check_invariants(restored)
    assert state_view(restored)["pauses"] == state_view(run.core)["pauses"]
    assert restored.pauses() == pauses
    live = assigned_ids(run(run.core.grant_credit("w", 10, T0 + 3)))
    again = assigned_ids(restored.grant_credit("w", 10, T0 + 3))
    assert sorted(live) == sorted(again) and live
    assert all(run.core.job(j).exec == "pdf.x" for j in live)  # type: ignore[union-attr]
    for scope, target in (("exec", "mail.*"), ("client", "acme")):
        live = assigned_ids(run(run.core.unpause(scope, target, T0 + 4)))
        again = assigned_ids(restored.unpause(scope, target, T0 + 4))
        assert sorted(live) == sorted(again) and live
    run.check()


def test_restore_without_the_pauses_would_start_held_jobs() -> None:
    """Why the pauses must be passed: the records alone do not say what is paused."""
    run, _ = _paused_scenario()
    restored = Dispatcher.restore(
        [JobRecord.from_dict(job.to_dict()) for job in run.core.jobs()],
        config=run.core.config,
        workers=run.core.workers(),
    )
    held = assigned_ids(restored.grant_credit("w", 10, T0 + 3))
    assert {restored.job(j).exec for j in held} > {"pdf.x"}  # type: ignore[union-attr]


def test_state_view_lists_the_pauses_in_force() -> None:
    run, _ = _paused_scenario()
    view = state_view(run.core)["pauses"]
    assert view == {
        "client:acme": {
            "type": "paused",
            "epoch": 0,
            "at": T0 + 2,
            "scope": "client",
            "target": "acme",
        },
        "exec:mail.*": {
            "type": "paused",
            "epoch": 0,
            "at": T0 + 1,
            "scope": "exec",
            "target": "mail.*",
            "reason": "smtp down",
        },
    }
    run(run.core.unpause("client", "acme", T0 + 3))
    assert list(state_view(run.core)["pauses"]) == ["exec:mail.*"]


def test_replay_of_the_log_gives_the_same_state() -> None:
    run, _ = _paused_scenario()
    run(run.core.grant_credit("w", 3, T0 + 3))
    run(run.core.unpause("exec", "mail.*", T0 + 4))
    run(run.core.pause("exec", "pdf.>", T0 + 5))
    run(run.core.grant_credit("w", 3, T0 + 6))
    run.check()
    replica = Dispatcher(run.core.config)
    replica.apply_all(event_from_dict(event.to_dict()) for event in run.log)
    assert replica.pauses() == run.core.pauses()


def test_a_contradicting_pause_event_is_refused_and_changes_nothing() -> None:
    run = PauseRun()
    run(run.core.pause("exec", "image.*", T0))
    before = state_view(run.core)
    with pytest.raises(InvalidTransition):
        run.core.apply(Paused(epoch=0, at=T0, scope=PauseScope.EXEC, target="image.*"))
    with pytest.raises(InvalidTransition):
        run.core.apply(Resumed(epoch=0, at=T0, scope=PauseScope.CLIENT, target="acme"))
    with pytest.raises(InvalidTransition):
        run.core.apply(Paused(epoch=0, at=T0, scope=PauseScope.EXEC, target="bad..pattern"))
    assert state_view(run.core) == before
    check_invariants(run.core)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"scope": "exec", "target": "a..b"}, r"paused\.target: .*empty token"),
        ({"scope": "exec", "target": "a.>.b"}, r"paused\.target"),
        ({"scope": "client", "target": "c" * 1000}, r"paused\.target: longer than"),
        ({"scope": "tenant", "target": "x"}, r"paused\.scope"),
        ({"scope": "exec", "target": ""}, r"paused\.target"),
    ],
)
def test_a_bad_paused_event_is_refused_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        event_from_dict({"type": "paused", "epoch": 0, "at": 1.0, **data})

"""Client and leader commands: submission and dedup, cancellation, redrive, prune, epochs;
and the promise behind them all: the same commands give the same events, and replaying the
events rebuilds the same state."""

from __future__ import annotations

import inspect

import pytest

from dispatch.core import (
    Assigned,
    CancelRequested,
    Dispatcher,
    Enqueued,
    JobStatus,
    LeaderElected,
    RejectCode,
    Rejected,
    check_invariants,
    state_view,
)
from dispatch.core.client_commands import ClientCommands
from dispatch.core.job import public_status
from dispatch.core.leader_commands import LeaderCommands
from dispatch.core.queries import DispatcherQueries
from dispatch.core.scheduler import Scheduler
from dispatch.core.settlement import SettlementCommands
from dispatch.core.worker_commands import WorkerCommands
from tests.unit.core.helpers import (
    T0,
    ack,
    assigned_ids,
    assignments,
    make,
    request,
    types,
    worker,
)


def test_submit_enqueues_a_queued_job() -> None:
    d = make()
    events = d.submit(request("j1", client_id="acme", priority=2), T0)
    assert types(events) == ["enqueued"]
    job = d.job("j1")
    assert job is not None
    assert (job.status, job.client_id, job.exec, job.attempts) == (
        JobStatus.QUEUED,
        "acme",
        "image.resize",
        0,
    )
    assert job.payload == {"job": "j1"} and job.priority == 2 and job.submitted_at == T0


def test_duplicate_submit_enqueues_once() -> None:
    d = make()
    d.submit(request("j1", payload="first"), T0)
    again = d.submit(request("j1", payload="second", exec_name="other.exec"), T0 + 1)
    assert again == []
    job = d.job("j1")
    assert job is not None and job.payload == "first" and job.exec == "image.resize"
    assert d.counts()["queued"] == 1


def test_duplicate_submit_of_a_finished_job_answers_the_existing_job() -> None:
    d = make()
    (assigned,) = assignments(d.submit(request("j1"), T0) + worker(d, "w", credits=1))
    ack(d, assigned, T0 + 1, result=42)
    assert d.submit(request("j1"), T0 + 2) == []
    job = d.job("j1")
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.result == 42


def test_submit_many_skips_duplicates_and_assigns_in_one_pass() -> None:
    d = make()
    worker(d, "w", credits=10)
    events = d.submit_many([request("a"), request("b"), request("a"), request("c")], T0)
    assert types(events) == ["enqueued"] * 3 + ["assigned"] * 3
    assert [e.job_id for e in events if isinstance(e, Enqueued)] == ["a", "b", "c"]


def test_submit_defaults_come_from_the_config() -> None:
    d = make(max_attempts=7, ack_timeout_s=12.0)
    (enqueued,) = d.submit(request("j1"), T0)
    assert isinstance(enqueued, Enqueued)
    assert (enqueued.max_attempts, enqueued.timeout_s) == (7, 12.0)
    (own,) = d.submit(request("j2", max_attempts=2, timeout_s=3.0), T0)
    assert isinstance(own, Enqueued) and (own.max_attempts, own.timeout_s) == (2, 3.0)


def test_redrive_requeues_a_dead_job_with_attempts_reset() -> None:
    d = make(max_attempts=1)
    worker(d, "w", credits=1)
    (first,) = assignments(d.submit(request("j1"), T0))
    d.fail("j1", 1, first.lease, T0 + 1, error="boom", retryable=False)
    events = d.redrive("j1", T0 + 2)
    assert types(events) == ["redriven"]
    job = d.job("j1")
    assert job is not None and job.status is JobStatus.QUEUED and job.attempts == 0
    assert job.dead_reason is None and d.dead_letters() == []
    (again,) = assignments(d.grant_credit("w", 1, T0 + 3))
    assert again.attempt == 1


@pytest.mark.parametrize("status", ["queued", "running", "succeeded"])
def test_redrive_of_a_job_that_is_not_dead_is_rejected(status: str) -> None:
    d = make()
    d.submit(request("j1"), T0)
    if status != "queued":
        (assigned,) = assignments(worker(d, "w", credits=1))
        if status == "succeeded":
            ack(d, assigned, T0)
    with pytest.raises(Rejected) as caught:
        d.redrive("j1", T0)
    assert caught.value.code is RejectCode.NOT_DEAD
    with pytest.raises(Rejected) as unknown:
        d.redrive("nope", T0)
    assert unknown.value.code is RejectCode.NOT_FOUND


def test_cancel_a_queued_job() -> None:
    d = make()
    d.submit_many([request("j1"), request("j2")], T0)
    assert types(d.cancel("j1", T0 + 1)) == ["cancelled"]
    assert d.job("j1").status is JobStatus.CANCELLED  # type: ignore[union-attr]
    assert assigned_ids(worker(d, "w", credits=5)) == ["j2"], "a cancelled job never runs"


def test_cancel_a_delayed_job() -> None:
    d = make()
    d.submit(request("later", delay_s=30.0), T0)
    d.cancel("later", T0 + 1)
    worker(d, "w", credits=5)
    assert d.tick(T0 + 60) == []


def test_cancel_of_a_running_job_asks_its_worker_to_stop() -> None:
    """Not refused: the job stays running (`cancelling` to a user) until its worker stops."""
    d = make(cancel_grace_s=5.0)
    d.submit(request("j1"), T0)
    assert assigned_ids(worker(d, "w", credits=1)) == ["j1"]
    (requested,) = d.cancel("j1", T0 + 1)
    assert isinstance(requested, CancelRequested)
    assert (requested.worker_id, requested.attempt, requested.deadline) == ("w", 1, T0 + 6)
    job = d.job("j1")
    assert job is not None and job.status is JobStatus.RUNNING
    assert public_status(job) == "cancelling" and job.cancel_requested_at == T0 + 1
    assert d.cancel("j1", T0 + 2) == [], "asking again changes nothing"


@pytest.mark.parametrize("status", ["succeeded", "cancelled"])
def test_cancel_of_a_finished_job_is_rejected(status: str) -> None:
    d = make()
    d.submit(request("j1"), T0)
    if status == "cancelled":
        d.cancel("j1", T0)
    else:
        (assigned,) = assignments(worker(d, "w", credits=1))
        ack(d, assigned, T0)
    with pytest.raises(Rejected) as caught:
        d.cancel("j1", T0)
    assert caught.value.code is RejectCode.NOT_CANCELLABLE and caught.value.http_status == 409
    assert d.job("j1").status.value == status  # type: ignore[union-attr]


def test_cancel_of_an_unknown_job_is_not_found() -> None:
    with pytest.raises(Rejected) as caught:
        make().cancel("nope", T0)
    assert caught.value.code is RejectCode.NOT_FOUND


def test_begin_epoch_stamps_later_events_and_leases() -> None:
    d = make()
    worker(d, "w", credits=1)
    (elected,) = d.begin_epoch(7, T0, holder="http://10.0.0.1:8000")
    assert isinstance(elected, LeaderElected) and elected.holder == "http://10.0.0.1:8000"
    enqueued, assigned = d.submit(request("j1"), T0)
    assert enqueued.epoch == 7 and isinstance(assigned, Assigned)
    assert assigned.lease.startswith("7.")
    with pytest.raises(Rejected) as caught:
        d.begin_epoch(7, T0)
    assert caught.value.code is RejectCode.STALE_EPOCH


def test_same_commands_give_the_same_events() -> None:
    def scenario() -> list[object]:
        d = make(ack_timeout_s=5.0)
        out: list[object] = []
        out += worker(d, "w1", credits=2) + worker(d, "w2", ["job.assign.mail.*"], credits=2)
        out += d.submit_many([request("a"), request("m", "mail.x"), request("b")], T0)
        out += d.tick(T0 + 5) + d.tick(T0 + 11)
        return [event.to_dict() for event in out]  # type: ignore[attr-defined]

    assert scenario() == scenario()


def test_emitted_events_replay_to_the_same_state() -> None:
    d = make(ack_timeout_s=5.0, max_attempts=2, default_cap=2)
    log = worker(d, "w1", credits=3) + worker(d, "w2", ["job.assign.mail.*"], credits=1)
    log += d.submit_many([request(f"j{n}", client_id=f"c{n % 2}") for n in range(6)], T0)
    log += d.submit(request("m", "mail.send", delay_s=3.0), T0)
    first = assignments(log)[0]
    log += d.fail(first.job_id, 1, first.lease, T0 + 1, error="x")
    log += d.tick(T0 + 6) + d.lose_worker("w2", T0 + 7) + d.tick(T0 + 20)
    replayed = Dispatcher(d.config)
    assert replayed.apply_all(log) == len(log)
    check_invariants(replayed)
    assert state_view(replayed) == state_view(d)


def test_prune_forgets_finished_jobs_so_their_ids_can_be_reused() -> None:
    d = make()
    worker(d, "w", credits=2)
    (assigned,) = assignments(d.submit(request("done"), T0))
    ack(d, assigned, T0 + 1)
    d.submit(request("kept", "other.exec"), T0 + 2)
    assert d.prune(T0, T0 + 10) == [], "nothing finished at or before T0"
    (pruned,) = d.prune(T0 + 1, T0 + 10)
    assert pruned.type == "pruned" and d.job("done") is None and "kept" in d
    assert types(d.submit(request("done"), T0 + 11))[0] == "enqueued"


def test_latest_dead_letters_are_the_newest_first_copies_up_to_the_limit() -> None:
    d = make(max_attempts=1)
    worker(d, "w", credits=3)
    submitted = d.submit_many([request("a"), request("b"), request("c")], T0)
    leases = {assigned.job_id: assigned.lease for assigned in assignments(submitted)}
    for offset, job_id in enumerate(("b", "a", "c"), start=1):
        d.fail(job_id, 1, leases[job_id], T0 + offset, error=f"{job_id} broke", retryable=False)
    assert [job.id for job in d.latest_dead_letters(2)] == ["c", "a"]
    assert [job.id for job in d.latest_dead_letters(10)] == ["c", "a", "b"]
    assert d.latest_dead_letters(0) == []
    copy = d.latest_dead_letters(1)[0]
    copy.error = "changed"
    dead = d.job("c")
    assert dead is not None and dead.error == "c broke", "a copy, not the live record"
    d.redrive("a", T0 + 10)
    assert [job.id for job in d.latest_dead_letters(10)] == ["c", "b"]


def test_latest_finished_are_succeeded_and_cancelled_jobs_newest_first() -> None:
    d = make()
    d.submit(request("gone"), T0)
    d.cancel("gone", T0)
    worker(d, "w", credits=2)
    (first,) = assignments(d.submit(request("first"), T0 + 1))
    (second,) = assignments(d.submit(request("second"), T0 + 1))
    d.submit(request("waiting", "other.exec"), T0 + 1)
    ack(d, second, T0 + 2)
    ack(d, first, T0 + 3, result="ok")
    assert [job.id for job in d.latest_finished(10)] == ["first", "second", "gone"]
    newest = d.latest_finished(1)
    assert [(job.id, job.result) for job in newest] == [("first", "ok")]
    newest[0].result = "changed"
    job = d.job("first")
    assert job is not None and job.result == "ok", "a copy, not the live record"


def test_latest_finished_skips_pruned_jobs_and_shows_a_reused_id_once() -> None:
    d = make()
    worker(d, "w", credits=2)
    (old,) = assignments(d.submit(request("j"), T0))
    ack(d, old, T0 + 1, result="old")
    d.prune(T0 + 1, T0 + 2)
    assert d.latest_finished(10) == []
    (new,) = assignments(d.submit(request("j"), T0 + 3))
    ack(d, new, T0 + 4, result="new")
    assert [(job.id, job.result) for job in d.latest_finished(10)] == [("j", "new")]


@pytest.mark.parametrize(
    ("part", "names"),
    [
        (LeaderCommands, ["begin_epoch", "resume", "prune"]),
        (ClientCommands, ["submit", "submit_many", "exec_queues_refusal", "cancel", "redrive"]),
        (WorkerCommands, ["join", "grant_credit", "worker_heartbeat", "lose_worker"]),
        (SettlementCommands, ["ack", "ack_many", "fail", "heartbeat"]),
        (Scheduler, ["tick", "dispatch"]),
        (DispatcherQueries, [name for name in vars(DispatcherQueries) if name[0] != "_"]),
    ],
)
def test_the_dispatcher_lists_each_command_of_its_parts_with_the_same_signature(
    part: type, names: list[str]
) -> None:
    # `Dispatcher` delegates by hand: a keyword added to a part but not to the facade
    # would be unreachable for callers.
    for name in names:
        assert inspect.signature(getattr(Dispatcher, name)) == inspect.signature(
            getattr(part, name)
        ), name

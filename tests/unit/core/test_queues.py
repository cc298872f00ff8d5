"""Exec queues: seq order within a lane, priorities, round-robin lanes, parking at the cap."""

from __future__ import annotations

import pytest

from dispatch.core import Dispatcher, JobRecord, JobStatus, SubmitRequest
from dispatch.core.errors import RejectCode, Rejected
from dispatch.core.events import Enqueued, Event
from dispatch.core.queues import (
    MAX_EXEC_QUEUES_PER_CLIENT,
    ClientState,
    ExecQueue,
    Lane,
    Level,
    unpark,
)
from tests.unit.core.helpers import T0, make, request


def rec(job_id: str, seq: int, client: str = "c", priority: int = 0) -> JobRecord:
    return JobRecord(
        id=job_id,
        client_id=client,
        exec="x",
        payload=None,
        max_attempts=3,
        timeout_s=1.0,
        submitted_at=0.0,
        updated_at=0.0,
        seq=seq,
        priority=priority,
    )


def drain(queue: ExecQueue) -> list[str]:
    """Serve every job the way the dispatcher does: next_job, then take."""
    served = []
    while (job := queue.next_job()) is not None:
        job.status = JobStatus.RUNNING
        queue.take(job)
        served.append(job.id)
    return served


def test_lane_serves_in_seq_order_whatever_the_arrival_order() -> None:
    lane = Lane(ClientState("c", 10), Level(0, ExecQueue("x")))
    for job in (rec("b", 5), rec("d", 7), rec("c", 6), rec("a", -1)):
        lane.push(job)
    order = []
    while (head := lane.head()) is not None:
        head.status = JobStatus.RUNNING
        lane.take(head)
        order.append(head.id)
    assert order == ["a", "b", "c", "d"] and lane.live == 0


def test_higher_priority_first_then_clients_take_turns() -> None:
    queue = ExecQueue("x")
    a, b = ClientState("a", 10), ClientState("b", 10)
    for n in range(3):
        queue.push(rec(f"a{n}", n, "a"), a)
    for n in range(3):
        queue.push(rec(f"b{n}", 10 + n, "b"), b)
    queue.push(rec("urgent", 99, "b", priority=1), b)
    assert drain(queue) == ["urgent", "a0", "b0", "a1", "b1", "a2", "b2"]
    assert queue.ready == 0


def test_a_full_client_is_parked_and_comes_back() -> None:
    queue = ExecQueue("x")
    full, other = ClientState("full", 1), ClientState("other", 5)
    full.inflight = 1
    queue.push(rec("f1", 1, "full"), full)
    queue.push(rec("o1", 2, "other"), other)
    assert drain(queue) == ["o1"]
    assert [lane.client.client_id for lane in full.parked] == ["full"]
    assert queue.next_job() is None and queue.ready == 1
    full.inflight = 0
    back = unpark(full)
    assert [lane.client for lane in back] == [full] and full.parked == []
    assert drain(queue) == ["f1"]


def test_a_push_into_an_emptied_lane_wakes_the_queue() -> None:
    queue = ExecQueue("x")
    client = ClientState("c", 5)
    assert queue.push(rec("j1", 1), client) is True
    assert queue.push(rec("j2", 2), client) is False, "the lane already waits its turn"
    assert drain(queue) == ["j1", "j2"]
    assert queue.push(rec("j3", 3), client) is True


def test_cancelled_entries_are_skipped_and_compacted() -> None:
    queue = ExecQueue("x")
    client = ClientState("c", 5)
    jobs = [rec(f"j{n}", n) for n in range(200)]
    for job in jobs:
        queue.push(job, client)
    for job in jobs[:150]:
        job.status = JobStatus.CANCELLED
        queue.forget(job)
    lane = queue.lane_of(jobs[199])
    assert lane.live == 50 and len(lane.jobs) < 200, "stale entries were compacted"
    assert drain(queue) == [f"j{n}" for n in range(150, 200)]


def test_empty_levels_are_dropped_beyond_a_bound() -> None:
    queue = ExecQueue("x")
    client = ClientState("c", 100)
    for priority in range(20):
        queue.push(rec(f"p{priority}", priority, priority=priority), client)
    assert len(queue.priorities) == 20
    drain(queue)
    assert len(queue.priorities) <= 8
    assert queue.priorities == sorted(queue.priorities)


# --- exec queues per client ------------------------------------------------------------------


def _fill(dispatcher: Dispatcher, client_id: str, count: int, prefix: str = "kind") -> None:
    dispatcher.submit_many(
        [
            request(f"{client_id}-{n}", f"{prefix}{n}.run", client_id=client_id)
            for n in range(count)
        ],
        T0,
    )


def test_a_client_may_create_at_most_max_exec_queues() -> None:
    dispatcher = make()
    _fill(dispatcher, "c1", MAX_EXEC_QUEUES_PER_CLIENT)
    assert len(dispatcher.queue_stats()) == MAX_EXEC_QUEUES_PER_CLIENT
    limit = f"the most one client may .{MAX_EXEC_QUEUES_PER_CLIENT}"
    with pytest.raises(Rejected, match=limit) as no:
        dispatcher.submit(request("one-more", "new.kind", client_id="c1"), T0)
    assert no.value.code is RejectCode.INVALID and no.value.job_id == "one-more"
    assert dispatcher.job_view("one-more") is None
    assert len(dispatcher.queue_stats()) == MAX_EXEC_QUEUES_PER_CLIENT
    # An existing queue takes more jobs, whoever created it; another client has its own budget.
    assert dispatcher.submit(request("again", "kind7.run", client_id="c1"), T0)
    assert dispatcher.submit(request("theirs", "kind7.run", client_id="c2"), T0)
    assert dispatcher.submit(request("c2-own", "new.kind", client_id="c2"), T0)


def test_a_submitter_learns_early_that_a_batch_would_create_too_many_queues() -> None:
    dispatcher = make()
    _fill(dispatcher, "c1", MAX_EXEC_QUEUES_PER_CLIENT - 1)
    one_new = [request("a", "new.one", client_id="c1"), request("b", "new.one", client_id="c1")]
    assert dispatcher.exec_queues_refusal(one_new) is None
    two_new = [*one_new, request("c", "new.two", client_id="c1")]
    refusal = dispatcher.exec_queues_refusal(two_new)
    assert refusal is not None and "'c1'" in refusal and "would add 2" in refusal
    # Existing queues and other clients' budgets do not count against c1.
    existing = [request("d", "kind7.run", client_id="c1"), request("e", "x.y", client_id="c2")]
    assert dispatcher.exec_queues_refusal([*one_new, *existing]) is None


def test_a_batch_leaves_out_and_reports_what_would_create_a_queue_too_many() -> None:
    dispatcher = make()
    _fill(dispatcher, "c1", MAX_EXEC_QUEUES_PER_CLIENT - 1)
    refused: list[tuple[SubmitRequest, str]] = []
    batch = [
        request("last-allowed", "new.one", client_id="c1"),
        request("over", "new.two", client_id="c1"),
        request("fine", "new.one", client_id="c1"),  # the queue the batch just created
        request("other-client", "new.three", client_id="c2"),
    ]
    events = dispatcher.submit_many(batch, T0, refused=refused)
    assert [event.job_id for event in events if isinstance(event, Enqueued)] == [
        "last-allowed",
        "fine",
        "other-client",
    ]
    assert [(request.id, "new.two" in reason) for request, reason in refused] == [("over", True)]
    # Without a list to report to, the refused job is still left out, and the rest goes on.
    assert dispatcher.submit_many([request("x", "new.four", client_id="c1")], T0) == []


def test_a_replayed_log_counts_each_clients_queues_like_the_leader() -> None:
    leader = make()
    logged: list[Event] = []
    for n in range(MAX_EXEC_QUEUES_PER_CLIENT):
        logged += leader.submit(request(f"c1-{n}", f"kind{n}.run", client_id="c1"), T0)
    replica = make()
    replica.apply_all(logged)
    with pytest.raises(Rejected, match="exec queues"):
        replica.submit(request("one-more", "new.kind", client_id="c1"), T0)

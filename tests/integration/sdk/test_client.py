"""The client SDK against a real node and the real broker: every call, its typed errors,
failover across the node list and 307 redirects (from a real loopback server)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from dispatch.client import (
    Accepted,
    AsyncClient,
    Backoff,
    Client,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from dispatch.stack.ports import free_port
from tests.integration.api.conftest import RunningNode, poll_until
from tests.integration.sdk.conftest import Redirector, visible

pytestmark = pytest.mark.integration

SUBJECTS = ["job.assign.sdk.>"]


def _client(node: RunningNode, role: str = "admin", **options: object) -> Client:
    return Client(node.url, node.keys[role], **options)  # type: ignore[arg-type]


def _settle(worker: httpx.Client, assignment: dict[str, object], kind: str, **body: object) -> None:
    answer = worker.post(
        f"/v1/jobs/{assignment['id']}/{kind}",
        json={"attempt": assignment["attempt"], "lease": assignment["lease"], **body},
    )
    assert answer.status_code == 200, answer.text


def test_submit_get_wait_and_resubmit(api_node: RunningNode) -> None:
    with _client(api_node, "client") as client, api_node.client("worker") as worker:
        accepted = client.submit("sdk.add", {"a": 1, "b": 2}, id="add-1", max_attempts=2)
        assert (accepted.id, accepted.status, accepted.existing) == ("add-1", "queued", False)
        job = visible(client, "add-1")
        assert (job.exec, job.payload, job.max_attempts, job.terminal) == (
            "sdk.add", {"a": 1, "b": 2}, 2, False,
        )  # fmt: skip
        with pytest.raises(WaitTimeout) as timed_out:
            client.wait("add-1", timeout_s=0.3)
        assert timed_out.value.job.status in ("queued", "running")

        [assignment] = poll_until(worker, "w1", SUBJECTS, 1)
        _settle(worker, assignment, "ack", result=3)
        done = client.wait("add-1", timeout_s=20)
        assert (done.status, done.result, done.attempts, done.terminal) == ("succeeded", 3, 1, True)

        again = client.submit("sdk.add", {"a": 1, "b": 2}, id="add-1")
        assert (again.status, again.existing) == ("succeeded", True)
        # Without an id, one is made client-side: each call is a new job.
        first, second = client.submit("sdk.add"), client.submit("sdk.add")
        assert first.id != second.id and not first.existing and not second.existing


def test_submit_many_sends_batches_of_at_most_a_thousand(api_node: RunningNode) -> None:
    batches: list[int] = []
    with _client(api_node, "client") as client:
        jobs = [{"exec": "sdk.many", "payload": n, "id": f"m{n}"} for n in range(2100)]
        accepted = client.submit_many(jobs, on_batch=lambda answers: batches.append(len(answers)))
        assert batches == [1000, 1000, 100]
        assert [a.id for a in accepted] == [f"m{n}" for n in range(2100)]
        assert visible(client, "m2099").payload == 2099
        # The same ids again are the same jobs.
        again = client.submit_many(jobs[:5], batch_size=2)
        assert all(answer.existing for answer in again)


def test_cancel_dlq_redrive_and_the_live_views(api_node: RunningNode) -> None:
    with _client(api_node) as admin, api_node.client("worker") as worker:
        admin.submit("sdk.cancel.me", id="c1")
        visible(admin, "c1")
        assert admin.cancel("c1").status == "cancelled"
        with pytest.raises(Conflict) as refused:
            admin.cancel("c1")
        assert refused.value.error == "not_cancellable" and refused.value.status == 409

        admin.submit("sdk.doomed", {"n": 1}, id="d1")
        [assignment] = poll_until(worker, "w1", SUBJECTS, 1)
        _settle(worker, assignment, "fail", error="boom", retryable=False)
        assert admin.wait("d1", timeout_s=20).status == "dead"
        [dead] = admin.dlq(exec="sdk.doomed")
        assert (dead.id, dead.error, dead.dead_reason) == ("d1", "boom", "permanent_failure")
        assert admin.dlq(exec="sdk.other") == []
        assert admin.redrive("d1").status == "queued"
        with pytest.raises(Conflict) as not_dead:
            admin.redrive("d1")
        assert not_dead.value.error == "not_dead"

        assert any(queue.exec == "sdk.doomed" and queue.ready == 1 for queue in admin.queues())
        assert [w.worker_id for w in admin.workers()] == ["w1"]
        leader = admin.leader()
        assert leader.is_leader and leader.leader == api_node.url and (leader.epoch or 0) >= 1


def test_errors_are_typed(api_node: RunningNode) -> None:
    with _client(api_node, "client") as client:
        with pytest.raises(NotFound) as missing:
            client.get("nope")
        assert missing.value.status == 404 and "nope" in missing.value.detail
        with pytest.raises(Invalid) as invalid:
            client.submit("bad exec name")
        assert invalid.value.status == 422 and "exec" in invalid.value.detail
        with pytest.raises(Forbidden):
            client.dlq()
    with Client(api_node.url, "not-a-key") as stranger, pytest.raises(Unauthorized):
        stranger.get("x")
    with _client(api_node) as admin, pytest.raises(Invalid, match=r"jobs\[0\]\.unknown_field"):
        admin.submit_many([{"exec": "a.b", "unknown_field": 1}])


def test_the_next_node_is_tried_when_one_is_down_and_unavailable_is_raised_in_time(
    api_node: RunningNode,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with Client([dead, api_node.url], api_node.keys["admin"]) as client:
        assert client.leader().is_leader
        assert client.router.current == api_node.url
    quick = Backoff(initial_s=0.05, max_s=0.2)
    with Client(dead, "key", retry_timeout_s=1.0, backoff=quick) as client:
        started = time.monotonic()
        with pytest.raises(Unavailable) as unavailable:
            client.get("x")
        assert time.monotonic() - started < 3
        assert dead in unavailable.value.detail


def test_a_307_is_followed_to_the_leader_and_remembered(
    api_node: RunningNode, redirector: Redirector
) -> None:
    with Client(redirector.url, api_node.keys["admin"]) as client:
        accepted = client.submit("sdk.redirected", {"x": 1}, id="r1")
        assert accepted.status == "queued"
        assert client.router.current == api_node.url
        assert visible(client, "r1").payload == {"x": 1}
    assert redirector.hits == 1  # the leader was remembered after the first redirect

    async def stream_through_redirect() -> str:
        async with (
            AsyncClient(redirector.url, api_node.keys["client"]) as client,
            client.results(),
        ):
            return client.router.current

    assert asyncio.run(stream_through_redirect()) == api_node.url
    assert redirector.hits == 2


def test_async_client_and_the_results_stream(api_node: RunningNode) -> None:
    async def scenario() -> None:
        async with AsyncClient(api_node.url, api_node.keys["client"]) as client:
            async with client.results() as results:
                await client.submit_many(
                    [{"exec": "sdk.stream", "payload": n, "id": f"s{n}"} for n in range(3)]
                )
                with api_node.client("worker") as worker:
                    for assignment in await asyncio.to_thread(
                        poll_until, worker, "w1", SUBJECTS, 3
                    ):
                        payload = assignment["payload"]
                        assert isinstance(payload, int)
                        _settle(worker, assignment, "ack", result=payload * 10)
                pushed = {}
                async for job in results:
                    pushed[job.id] = job.result
                    if len(pushed) == 3:
                        break
            assert pushed == {"s0": 0, "s1": 10, "s2": 20}
            assert (await client.wait("s2", 5)).result == 20
            assert (await client.get("s1")).status == "succeeded"
            with pytest.raises(NotFound):
                await client.cancel("missing")

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_cancel_of_a_running_job_the_worker_calls_and_bulk_cancel(api_node: RunningNode) -> None:
    async def scenario() -> None:
        async with (
            AsyncClient(api_node.url, api_node.keys["admin"]) as admin,
            AsyncClient(api_node.url, api_node.keys["worker"]) as worker,
        ):
            await admin.submit("sdk.run.me", id="r1", max_run_s=600)
            polled = await worker.poll_term("w1", SUBJECTS, 1, 5.0, held=[], epoch=None)
            [assignment] = polled.assignments
            attempt, lease = int(assignment["attempt"]), str(assignment["lease"])
            running = await admin.get("r1")
            assert running.status == "running" and running.max_run_s == 600
            assert running.run_limit_at is not None and running.cancel_requested_at is None
            beat = await worker.heartbeat_answer("r1", attempt, lease, "w1")
            assert beat.cancel is None and beat.deadline <= running.run_limit_at

            asked = await admin.cancel("r1", reason="changed my mind")
            assert (asked.status, asked.attempts) == ("cancelling", 1)
            assert (await admin.cancel("r1")).status == "cancelling"  # a repeat: the same
            beat = await worker.heartbeat_answer("r1", attempt, lease, "w1")
            assert beat.cancel == "cancel_requested"
            again = await worker.poll_term(
                "w1", SUBJECTS, 0, 0.0, held=[("r1", attempt, lease)], epoch=polled.epoch
            )
            assert again.cancel == [{"id": "r1", "attempt": 1, "reason": "cancel_requested"}]
            await worker.fail("r1", attempt, lease, "cancelled: cancel_requested",
                              retryable=False, worker_id="w1")  # fmt: skip
            done = await admin.get("r1")
            assert (done.status, done.terminal, done.run_limit_at) == ("cancelled", True, None)
            with pytest.raises(Conflict):
                await worker.heartbeat("r1", attempt, lease, "w1")

            await admin.submit_many([{"exec": "sdk.bulk", "id": f"b{n}"} for n in range(3)])
            for n in range(3):
                while True:
                    try:
                        await admin.get(f"b{n}")
                        break
                    except NotFound:
                        await asyncio.sleep(0.05)
            assert await admin.cancel_many(exec="sdk.bulk", limit=2) == {
                "cancelled": 2, "cancelling": 0,
            }  # fmt: skip
            assert await admin.cancel_many(exec="sdk.*", status="any") == {
                "cancelled": 1, "cancelling": 0,
            }  # fmt: skip

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_sync_client_cancels_with_a_reason_and_bulk(api_node: RunningNode) -> None:
    with _client(api_node) as admin, _client(api_node, "client") as client:
        client.submit("sdk.queued", id="q1")
        visible(client, "q1")
        cancelled = client.cancel("q1", reason="not needed")
        assert cancelled.status == "cancelled"
        admin.submit("sdk.queued", id="q2", client_id="c9")
        visible(admin, "q2")
        assert admin.cancel_many(client_id="c9") == {"cancelled": 1, "cancelling": 0}
        assert admin.get("q2").status == "cancelled"
        with pytest.raises(Forbidden):
            client.cancel_many(exec="sdk.*")


# --- limits -----------------------------------------------------------------------------------


def test_limits_set_read_and_removed_and_a_keyed_job_waits_its_turn(
    api_node: RunningNode,
) -> None:
    with _client(api_node) as admin, api_node.client("worker") as worker:
        limit = admin.set_limit("key", "sdk:acct", max_inflight=1, reason="serial")
        assert (limit.scope, limit.target, limit.max_inflight, limit.rate) == (
            "key", "sdk:acct", 1, None,
        )  # fmt: skip
        assert (limit.source, limit.by, limit.reason) == ("runtime", "dev-admin", "serial")
        assert admin.limit("key", "sdk:acct") == limit
        assert [(lim.scope, lim.target) for lim in admin.limits()] == [("key", "sdk:acct")]

        for n in range(2):
            admin.submit("sdk.keyed", id=f"kd{n}", key="sdk:acct")
        assert visible(admin, "kd1").key == "sdk:acct"
        [first] = poll_until(worker, "w1", SUBJECTS, 1)
        assert admin.limit("key", "sdk:acct").inflight == 1
        assert admin.get("kd1").status == "queued"

        rated = admin.set_limit("exec", "sdk.>", rate=100.0)
        assert (rated.rate, rated.burst) == (100.0, 100)
        with pytest.raises(Invalid, match="rate"):
            admin.set_limit("exec", "sdk.>", rate=-1)
        with pytest.raises(Invalid, match="key"):
            admin.set_limit("key", "a*b", max_inflight=1)
        with pytest.raises(Invalid, match=r"body\.key"):
            admin.submit("sdk.keyed", key="has*star")

        removed = admin.remove_limit("key", "sdk:acct")
        assert removed.removed and removed.limit is None
        assert not admin.remove_limit("key", "sdk:acct").removed
        with pytest.raises(NotFound):
            admin.limit("key", "sdk:acct")
        [second] = poll_until(worker, "w1", SUBJECTS, 1)
        assert {first["id"], second["id"]} == {"kd0", "kd1"}
        assert admin.remove_limit("exec", "sdk.>").removed
        # Targets are whole path rests, whatever they hold.
        for odd in ("..", "a/b?c#d", "key with spaces:é"):
            assert admin.set_limit("key", odd, max_inflight=1).target == odd
            assert admin.limit("key", odd).target == odd
            assert admin.remove_limit("key", odd).removed
    with _client(api_node, "client") as client, pytest.raises(Forbidden):
        client.limits()


def test_the_async_client_sets_and_removes_limits(api_node: RunningNode) -> None:
    async def scenario() -> None:
        async with AsyncClient(api_node.url, api_node.keys["admin"]) as admin:
            limit = await admin.set_limit("client", "sdk-tenant", max_inflight=3, rate=2.5)
            assert (limit.max_inflight, limit.rate, limit.burst) == (3, 2.5, 3)
            assert [lim.target for lim in await admin.limits()] == ["sdk-tenant"]
            assert (await admin.limit("client", "sdk-tenant")).max_inflight == 3
            accepted = await admin.submit("sdk.async", id="ak", key="async:1")
            assert accepted.id == "ak"
            assert (await admin.remove_limit("client", "sdk-tenant")).removed
            assert await admin.limits() == []
            for odd in ("a/b?c#d %2F", "x..", ".."):
                assert (await admin.set_limit("key", odd, max_inflight=1)).target == odd
                assert (await admin.remove_limit("key", odd)).removed

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_concurrent_submits_share_requests_and_each_gets_its_own_answer(
    api_node: RunningNode,
) -> None:
    """200 tasks on one AsyncClient (gathered into shared requests): every job is in the log once,
    a repeated id is answered as existing, and a job the server refuses fails alone."""

    async def tasks() -> list[Accepted | Invalid]:
        async with AsyncClient(api_node.url, api_node.keys["client"]) as client:

            async def one(n: int) -> Accepted | Invalid:
                try:
                    if n == 7:  # a priority the server refuses (the SDK does not check it)
                        return await client.submit("sdk.gather", id="g-bad", priority=10**9)
                    return await client.submit("sdk.gather", {"n": n}, id=f"g-{n % 150}")
                except Invalid as refused:
                    return refused

            return await asyncio.gather(*(one(n) for n in range(200)))

    answers = asyncio.run(tasks())
    refused = answers.pop(7)
    assert isinstance(refused, Invalid) and "priority" in str(refused)
    accepted = [answer for answer in answers if isinstance(answer, Accepted)]
    assert len(accepted) == 199
    assert sum(1 for answer in accepted if not answer.existing) == 150
    with _client(api_node, "client") as client:
        for n in range(150):
            assert visible(client, f"g-{n}").payload in ({"n": n}, {"n": n + 150})

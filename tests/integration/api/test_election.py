"""High availability with real processes: two `dispatch serve` nodes share one lease table,
one Kafka log and one warehouse. A standby beside a live leader follows it (relaying client
calls to it); `kill -9` the leader under load and the standby takes over with nothing lost
and nothing completed twice; a leader stopped (SIGSTOP) past its lease writes nothing after
its successor's election and comes back as a follower; a broker restart loses nothing."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import pytest

from dispatch.api.kafka_log import replay_events
from dispatch.auth import ensure_dev_keys
from dispatch.client import Client
from dispatch.core.events import Completed, Event, LeaderElected
from dispatch.settings import Settings
from dispatch.stack.broker import Broker
from dispatch.stack.ports import free_port
from dispatch.worker import Assignment, WorkerApp
from tests.integration.api.processes import ServiceProcess, Workers, start_a_pair

pytestmark = pytest.mark.integration


class Pair:
    def __init__(self, settings: Settings, folder: Path) -> None:
        self.settings = settings
        self.first = ServiceProcess(settings, free_port(), folder / "first.log")
        self.second = ServiceProcess(settings, free_port(), folder / "second.log")
        self.keys = ensure_dev_keys(settings.auth)

    @property
    def urls(self) -> list[str]:
        return [self.first.url, self.second.url]

    def start_both(self) -> None:
        """Both nodes at once, so their starts overlap: whichever takes the lease first
        leads, and is `first` from then on (`second` the standby)."""
        self.first, self.second = start_a_pair(self.first, self.second)

    def client(self, url: str, role: str = "admin") -> httpx.Client:
        return httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {self.keys[role]}"}, timeout=10
        )

    def logged(self) -> list[Event]:
        """Every event of the log in order (no fence applied: what was physically written)."""
        return [
            event
            for batch in replay_events(self.settings.kafka, client_id="election-test-audit")
            for event in batch.events
        ]


@pytest.fixture
def pair(broker_api_settings: Settings, tmp_path: Path) -> Iterator[Pair]:
    nodes = Pair(broker_api_settings, tmp_path)
    try:
        yield nodes
    finally:
        nodes.first.stop()
        nodes.second.stop()


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s:.0f} s"
        time.sleep(0.1)


def submit_until_done(pair: Pair, ids: list[str], timeout_s: float = 90.0) -> None:
    """Wait until every id is succeeded, asking whichever node answers (following 307s)."""
    pending = set(ids)
    deadline = time.monotonic() + timeout_s
    with httpx.Client(
        headers={"Authorization": f"Bearer {pair.keys['admin']}"}, timeout=10, follow_redirects=True
    ) as http:
        turn = 0
        while pending:
            assert time.monotonic() < deadline, f"{len(pending)} jobs never finished"
            url = pair.urls[turn % 2]
            try:
                for job_id in list(pending)[:200]:
                    answer = http.get(f"{url}/v1/jobs/{job_id}")
                    if answer.status_code == 200 and answer.json()["status"] == "succeeded":
                        pending.discard(job_id)
                    elif answer.status_code != 200:
                        turn += 1
                        break
            except httpx.TransportError:
                turn += 1
            time.sleep(0.2)


def completions(events: list[Event]) -> Counter[str]:
    return Counter(event.job_id for event in events if isinstance(event, Completed))


def test_a_standby_beside_a_live_leader_follows_it(pair: Pair) -> None:
    pair.first.start()
    pair.second.start(wait_ready=False)
    leader_epoch = pair.first.readiness()["epoch"]
    # Several lease lifetimes: the standby must never take a live lease.
    time.sleep(pair.settings.lease.ttl_s * 2)
    standby = pair.second.readiness()
    assert standby["role"] == "follower" and standby["ready"] is False
    assert standby["leader"] == pair.first.url
    assert pair.first.readiness()["epoch"] == leader_epoch

    with pair.client(pair.second.url) as follower:
        # Client calls are relayed to the leader (test_forward.py has the details).
        assert follower.get("/v1/queues?x=1").status_code == 200
        accepted = follower.post("/v1/jobs", json={"id": "via-standby", "exec": "ha.test"})
        assert accepted.status_code == 202
    with pair.client(pair.first.url) as leader:
        wait_for(
            lambda: leader.get("/v1/jobs/via-standby").status_code == 200, 10, "the job on leader"
        )
    elected = [event for event in pair.logged() if isinstance(event, LeaderElected)]
    assert [event.epoch for event in elected] == [leader_epoch]


def test_kill_9_the_leader_under_load_the_standby_takes_over(pair: Pair) -> None:
    pair.start_both()
    first_epoch = pair.first.readiness()["epoch"]
    accepted: list[str] = []
    killed_at = 0.0
    with (
        Workers(pair.urls, pair.keys["worker"], count=2),
        httpx.Client(
            headers={"Authorization": f"Bearer {pair.keys['client']}"}, timeout=10
        ) as http,
    ):
        for batch in range(24):
            jobs = [{"id": f"k{batch}-{n}", "exec": "ha.test"} for n in range(40)]
            # The SDK's way: the next node when one is down or has no leader to relay to
            # (503), until one takes it.
            deadline = time.monotonic() + 30
            turn = 0
            while True:
                url = pair.urls[turn % 2]
                turn += 1
                try:
                    answer = http.post(f"{url}/v1/jobs:batch", json={"jobs": jobs})
                except httpx.TransportError:
                    answer = None
                if answer is not None and answer.status_code != 503:
                    break
                assert time.monotonic() < deadline, "no node accepted a batch"
                time.sleep(0.2)
            assert answer is not None and answer.status_code == 202, answer.text
            accepted += [job["id"] for job in answer.json()["jobs"]]
            if batch == 8:
                pair.first.kill()
                killed_at = time.monotonic()
            time.sleep(0.1)
        pair.second.wait("/readyz", 30)
        assert time.monotonic() - killed_at < 30
        submit_until_done(pair, accepted)

    assert len(accepted) == 24 * 40
    logged = pair.logged()
    done = completions(logged)
    assert set(done) == set(accepted), "a job accepted was lost"
    assert max(done.values()) == 1, "a job completed twice"
    second_epoch = pair.second.readiness()["epoch"]
    assert second_epoch > first_epoch


def test_a_leader_stopped_past_its_lease_writes_nothing_and_follows(pair: Pair) -> None:
    pair.start_both()
    with pair.client(pair.first.url, "client") as first:
        assert first.post("/v1/jobs", json={"id": "before", "exec": "ha.test"}).status_code == 202
    pair.first.signal(signal.SIGSTOP)
    pair.second.wait("/readyz", 30)
    second_epoch = pair.second.readiness()["epoch"]
    pair.first.signal(signal.SIGCONT)

    # Resumed, the old leader finds its lease gone and its producer fenced: it follows.
    def follows_the_new_leader() -> bool:
        seen = pair.first.readiness()
        return bool(seen["role"] == "follower" and seen["leader"] == pair.second.url)

    wait_for(follows_the_new_leader, 20, "the old leader following the new one")
    with pair.client(pair.first.url, "client") as old:
        after = old.post("/v1/jobs", json={"id": "after", "exec": "ha.test"})
        assert after.status_code == 202
    with Workers(pair.urls, pair.keys["worker"], count=1):
        submit_until_done(pair, ["before", "after"], 30)

    logged = pair.logged()
    elected_at = max(
        i for i, event in enumerate(logged)
        if isinstance(event, LeaderElected) and event.epoch == second_epoch
    )  # fmt: skip
    stale = [event for event in logged[elected_at:] if event.epoch < second_epoch]
    assert stale == [], f"the deposed leader wrote after its successor's election: {stale[:3]}"


def test_a_broker_restart_under_load_loses_nothing(pair: Pair, kafka_broker: Broker) -> None:
    pair.first.start()
    accepted: list[str] = []
    with (
        Workers([pair.first.url], pair.keys["worker"], count=2),
        httpx.Client(
            base_url=pair.first.url,
            headers={"Authorization": f"Bearer {pair.keys['client']}"},
            timeout=30,
        ) as http,
    ):
        for batch in range(12):
            jobs = [{"id": f"b{batch}-{n}", "exec": "ha.test"} for n in range(40)]
            if batch == 4:
                try:
                    kafka_broker.stop()
                finally:
                    kafka_broker.start()
            deadline = time.monotonic() + 60
            while True:  # a client retries what was not acknowledged: 503 while Kafka is back
                try:
                    answer = http.post("/v1/jobs:batch", json={"jobs": jobs})
                    if answer.status_code == 202:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the node never took submissions again"
                time.sleep(0.5)
            accepted += [job["id"] for job in answer.json()["jobs"]]
        submit_until_done(pair, accepted)
    done = completions(pair.logged())
    assert set(done) == set(accepted)
    assert max(done.values()) == 1


@pytest.mark.parametrize("transport", ["ws", "rest"])
def test_the_sdks_ride_out_a_failover(pair: Pair, transport: Literal["ws", "rest"]) -> None:
    """The client and the worker SDK are given both nodes; the leader dies under them."""
    pair.start_both()
    app = WorkerApp("ha", concurrency=4)

    @app.handler("ha.*")
    def echo(job: Assignment) -> object:
        return job.payload

    failure: list[BaseException] = []

    def serve() -> None:
        try:
            app.run(
                handle_signals=False, urls=pair.urls, api_key=pair.keys["worker"],
                worker_id=f"ha-{transport}", keepalive_s=1.0, grace_s=2.0, transport=transport,
            )  # fmt: skip
        except BaseException as error:  # noqa: BLE001  (re-raised in the test's thread)
            failure.append(error)

    thread = threading.Thread(target=serve, name="ha-worker")
    thread.start()
    try:
        # The follower first in the client's list: it must not matter.
        with Client([pair.second.url, pair.first.url], pair.keys["admin"]) as client:
            before = [f"sdk-before-{n}" for n in range(20)]
            client.submit_many(
                {"id": job_id, "exec": "ha.echo", "payload": job_id} for job_id in before
            )
            assert all(client.wait(job_id, 30).result == job_id for job_id in before)
            pair.first.kill()
            after = [f"sdk-after-{n}" for n in range(20)]
            client.submit_many(
                {"id": job_id, "exec": "ha.echo", "payload": job_id} for job_id in after
            )
            assert all(client.wait(job_id, 60).result == job_id for job_id in after)
            assert client.leader().epoch is not None
    finally:
        app.stop()
        thread.join(60)
    assert not thread.is_alive(), "the worker did not stop"
    assert failure == []

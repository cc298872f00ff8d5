"""Runtime limits through a real node: `PUT /v1/limits/{client|exec|key}/{target}` bounds how
many jobs run at once and how fast they start. A key limit of 1 never runs two jobs of its
key at once, a key pattern gives each key its own budget, an exec pattern one budget for all
it matches, a client's max_inflight replaces its cap; lowering a limit lets running jobs go
on, removing it falls back to the settings' one. Bad input is a 422 naming the field; each
change records the admin key's name (`by`); a follower relays the calls and a restarted
leader keeps the limits in force."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatch.auth import ensure_dev_keys
from dispatch.core.events import Assigned, LimitRemoved, LimitSet
from dispatch.settings import LimitSettings, Settings
from dispatch.stack.ports import free_port
from tests.integration.api.conftest import RunningNode, poll, poll_until
from tests.integration.api.processes import (
    ServiceProcess,
    killable_service,
    service_client,
    start_a_pair,
)

pytestmark = pytest.mark.integration

ALL = ["job.assign.>"]


@pytest.fixture
def api_settings(api_settings: Settings) -> Settings:
    """A limit in the settings, that a runtime one replaces until it is removed; long ack
    timeouts, so that nothing is requeued while a test holds its assignments."""
    dispatcher = api_settings.dispatcher.model_copy(
        update={
            "limits": {"exec": {"configured.>": LimitSettings(max_inflight=2)}},
            "ack_timeout_s": 60.0,
            "max_ack_timeout_s": 60.0,
            "worker_expiry_s": 60.0,
        }
    )
    return api_settings.model_copy(update={"dispatcher": dispatcher})


def _submit(client: httpx.Client, job_id: str, exec_name: str, **fields: Any) -> None:
    answer = client.post("/v1/jobs", json={"id": job_id, "exec": exec_name, **fields})
    assert answer.status_code == 202, answer.text


def _ack(worker: httpx.Client, assignment: dict[str, Any]) -> None:
    answer = worker.post(
        f"/v1/jobs/{assignment['id']}/ack",
        json={"attempt": assignment["attempt"], "lease": assignment["lease"]},
    )
    assert answer.status_code == 200, answer.text


def _ids(assignments: list[dict[str, Any]]) -> list[str]:
    return sorted(str(assignment["id"]) for assignment in assignments)


def _put(admin: httpx.Client, path: str, **body: Any) -> dict[str, Any]:
    answer = admin.put(f"/v1/limits/{path}", json=body)
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    return view


def _known(node: RunningNode, *job_ids: str) -> None:
    for job_id in job_ids:
        node.wait_known(job_id)


def test_a_key_limit_of_one_runs_one_job_of_that_key_at_a_time(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        view = _put(admin, "key/account:42", max_inflight=1, reason="one at a time")
        assert (view["scope"], view["target"], view["max_inflight"]) == ("key", "account:42", 1)
        assert (view["source"], view["by"], view["reason"]) == ("runtime", "dev-admin",
                                                                "one at a time")  # fmt: skip
        assert view["rate"] is None and view["inflight"] == 0 and view["held"] == 0
        for n in range(1, 4):
            _submit(admin, f"k{n}", "lim.work", key="account:42")
        _submit(admin, "o1", "lim.work", key="account:7")
        _submit(admin, "n1", "lim.work")
        _known(api_node, "k1", "k2", "k3", "o1", "n1")
        assert admin.get("/v1/jobs/k1").json()["key"] == "account:42"
        assert admin.get("/v1/jobs/n1").json()["key"] is None

        first = poll_until(worker, "w1", ALL, 3)
        assert _ids(first) == ["k1", "n1", "o1"], "one of account:42; the others are free"
        assert poll(worker, "w1", ALL, credits=5, wait_s=0.5) == []
        held = admin.get("/v1/limits/key/account:42").json()
        assert held["inflight"] == 1 and held["held"] >= 1, held
        assert admin.get("/v1/jobs/k2").json()["status"] == "queued"

        _ack(worker, next(a for a in first if a["id"] == "k1"))
        [second] = poll_until(worker, "w1", ALL, 1)
        assert second["id"] == "k2"
        assert poll(worker, "w1", ALL, credits=5, wait_s=0.5) == []


def test_never_two_jobs_of_a_limited_key_at_once_under_a_steady_worker(
    api_node: RunningNode,
) -> None:
    """Twelve jobs of one key among twelve of others, a worker with eight slots acking each
    job 50 ms after it came: at no point does it hold two of the key."""
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        _put(admin, "key/tenant:a", max_inflight=1)
        jobs = [{"id": f"a{n}", "exec": "lim.steady", "key": "tenant:a"} for n in range(12)]
        jobs += [{"id": f"b{n}", "exec": "lim.steady", "key": f"tenant:b{n}"} for n in range(12)]
        answer = admin.post("/v1/jobs:batch", json={"jobs": jobs})
        assert answer.status_code == 202, answer.text
        held: dict[str, tuple[float, dict[str, Any]]] = {}
        done: list[str] = []
        most_of_the_key = 0
        deadline = time.monotonic() + 60
        while len(done) < len(jobs):
            assert time.monotonic() < deadline, f"only {len(done)} done"
            for assignment in poll(worker, "w1", ALL, credits=8 - len(held), wait_s=0.1):
                held[str(assignment["id"])] = (time.monotonic(), assignment)
            of_the_key = sum(1 for job_id in held if job_id.startswith("a"))
            most_of_the_key = max(most_of_the_key, of_the_key)
            assert of_the_key <= 1, sorted(held)
            for job_id, (since, assignment) in list(held.items()):
                if time.monotonic() - since >= 0.05:
                    _ack(worker, assignment)
                    done.append(job_id)
                    del held[job_id]
        assert most_of_the_key == 1
        assert sorted(done) == sorted(str(job["id"]) for job in jobs)


def test_a_key_pattern_gives_each_key_a_budget_of_its_own(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        _put(admin, "key/shop:*", max_inflight=1)
        for key in ("shop:1", "shop:2"):
            for n in range(2):
                _submit(admin, f"{key}-{n}", "lim.pattern", key=key)
        _known(api_node, "shop:1-1", "shop:2-1")
        assert _ids(poll_until(worker, "w1", ALL, 2)) == ["shop:1-0", "shop:2-0"]
        assert poll(worker, "w1", ALL, credits=5, wait_s=0.5) == []
        [pattern] = [
            limit
            for limit in admin.get("/v1/limits").json()["limits"]
            if limit["target"] == "shop:*"
        ]
        assert pattern["inflight"] is None, "a pattern's budgets are per key"


def test_an_exec_pattern_limit_is_one_budget_for_every_exec_it_matches(
    api_node: RunningNode,
) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        _put(admin, "exec/shared.>", max_inflight=1)
        _submit(admin, "s1", "shared.one")
        _submit(admin, "s2", "shared.two")
        _known(api_node, "s1", "s2")
        [started] = poll_until(worker, "w1", ALL, 1)
        assert poll(worker, "w1", ALL, credits=5, wait_s=0.5) == []
        assert admin.get("/v1/limits/exec/shared.>").json()["inflight"] == 1
        _ack(worker, started)
        [later] = poll_until(worker, "w1", ALL, 1)
        assert {started["id"], later["id"]} == {"s1", "s2"}


def test_a_client_max_inflight_holds_and_lowering_it_lets_running_jobs_finish(
    api_node: RunningNode,
) -> None:
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        _put(admin, "client/acme", max_inflight=2)
        for n in range(5):
            _submit(admin, f"c{n}", "lim.client", client_id="acme")
        _known(api_node, *(f"c{n}" for n in range(5)))
        running = poll_until(worker, "w1", ALL, 2)
        assert poll(worker, "w1", ALL, credits=5, wait_s=0.5) == []
        tenants = {t["client_id"]: t for t in admin.get("/v1/tenants").json()["tenants"]}
        assert tenants["acme"]["limit"] == {
            "max_inflight": 2, "rate": None, "burst": None, "source": "runtime",
        }  # fmt: skip

        # Loosened: one more starts at once.
        _put(admin, "client/acme", max_inflight=3)
        running += poll_until(worker, "w1", ALL, 1)
        # Lowered below what runs: the three go on; nothing starts until fewer than one run.
        view = _put(admin, "client/acme", max_inflight=1)
        assert view["inflight"] == 3
        for assignment in running[:2]:
            _ack(worker, assignment)
            assert poll(worker, "w1", ALL, credits=5, wait_s=0.3) == []
        _ack(worker, running[2])
        assert len(poll_until(worker, "w1", ALL, 1)) == 1


def test_a_rate_limit_spaces_the_starts(api_node: RunningNode) -> None:
    assert api_node.memory is not None
    with api_node.client("admin") as admin, api_node.client("worker") as worker:
        view = _put(admin, "exec/rated.job", rate=4, burst=1)
        assert (view["rate"], view["burst"], view["max_inflight"]) == (4.0, 1, None)
        for n in range(4):
            _submit(admin, f"r{n}", "rated.job")
        _known(api_node, "r3")
        assert len(poll_until(worker, "w1", ALL, 4)) == 4
    starts = sorted(
        event.at
        for batch in api_node.memory.batches()
        for event in batch.events
        if isinstance(event, Assigned) and event.job_id.startswith("r")
    )
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert all(gap >= 0.25 - 0.01 for gap in gaps), gaps  # 4 a second, a burst of 1


def test_a_limit_is_read_replaced_and_removed_back_to_the_settings_one(
    api_node: RunningNode,
) -> None:
    with api_node.client("admin") as admin:
        configured = admin.get("/v1/limits/exec/configured.>").json()
        assert (configured["source"], configured["max_inflight"]) == ("settings", 2)
        assert configured["by"] is None and configured["at"] is None
        listed = admin.get("/v1/limits").json()["limits"]
        assert any(limit["target"] == "configured.>" for limit in listed)

        replaced = _put(admin, "exec/configured.>", rate=10)
        assert (replaced["source"], replaced["max_inflight"], replaced["rate"]) == (
            "runtime", None, 10.0,
        ), "a runtime limit replaces the settings' one wholly"  # fmt: skip
        assert replaced["burst"] == 10
        # The same again changes nothing.
        assert _put(admin, "exec/configured.>", rate=10)["at"] == replaced["at"]

        removed = admin.delete("/v1/limits/exec/configured.>")
        assert removed.status_code == 200, removed.text
        answer = removed.json()
        assert answer["removed"] is True
        assert (answer["limit"]["source"], answer["limit"]["max_inflight"]) == ("settings", 2)
        again = admin.delete("/v1/limits/exec/configured.>").json()
        assert again["removed"] is False

        _put(admin, "key/gone", max_inflight=3)
        assert admin.delete("/v1/limits/key/gone").json() == {"removed": True, "limit": None}
        missing = admin.get("/v1/limits/key/gone")
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"


def test_a_target_with_slashes_and_dots_is_one_path(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin:
        view = _put(admin, "key/org/7/team:a", max_inflight=2)
        assert view["target"] == "org/7/team:a"
        assert admin.get("/v1/limits/key/org/7/team:a").json()["max_inflight"] == 2


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("PUT", "/v1/limits/queue/x", {"max_inflight": 1}, "scope"),
        ("GET", "/v1/limits/tenant/x", None, "scope"),
        ("PUT", "/v1/limits/exec/a.b", {"rate": 0}, "rate"),
        ("PUT", "/v1/limits/exec/a.b", {"rate": -1}, "rate"),
        ("PUT", "/v1/limits/exec/a.b", {"rate": 2_000_000}, "rate"),
        ("PUT", "/v1/limits/exec/a.b", {"max_inflight": 0}, "max_inflight"),
        ("PUT", "/v1/limits/exec/a.b", {"max_inflight": "5"}, "max_inflight"),
        ("PUT", "/v1/limits/exec/a.b", {"max_inflight": 1.5}, "max_inflight"),
        ("PUT", "/v1/limits/exec/a.b", {"max_inflight": 2_000_000_000}, "max_inflight"),
        ("PUT", "/v1/limits/exec/a.b", {"max_inflight": 1, "burst": 3}, "burst"),
        ("PUT", "/v1/limits/exec/a.b", {"rate": 1, "burst": 0}, "burst"),
        ("PUT", "/v1/limits/exec/a.b", {}, "max_inflight"),
        ("PUT", "/v1/limits/exec/a.b", {"reason": "nothing"}, "max_inflight"),
        ("PUT", "/v1/limits/exec/a.b", None, "body"),
        ("PUT", "/v1/limits/exec/a.b", {"max_inflight": 1, "reason": "x" * 1001}, "reason"),
        ("PUT", "/v1/limits/exec/a.b", {"max_inflight": 1, "max_inflights": 2}, "max_inflights"),
        ("PUT", "/v1/limits/exec/a.>.b", {"max_inflight": 1}, "exec"),
        ("PUT", "/v1/limits/exec/a..b", {"max_inflight": 1}, "exec"),
        ("PUT", "/v1/limits/exec/" + "e" * 300, {"max_inflight": 1}, "exec"),
        ("PUT", "/v1/limits/key/acc*ount", {"max_inflight": 1}, "key"),
        ("PUT", "/v1/limits/key/a**", {"max_inflight": 1}, "key"),
        ("PUT", "/v1/limits/key/" + "k" * 201, {"max_inflight": 1}, "key"),
        ("PUT", "/v1/limits/key/", {"max_inflight": 1}, "key"),
        ("PUT", "/v1/limits/key/a%09b", {"max_inflight": 1}, "key"),
        ("PUT", "/v1/limits/client/" + "c" * 200, {"max_inflight": 1}, "client_id"),
        ("DELETE", "/v1/limits/exec/a.>.b", None, "exec"),
        ("DELETE", "/v1/limits/key/a*b", None, "key"),
    ],
)
def test_a_bad_limit_is_refused_with_422_naming_the_field(
    api_node: RunningNode, method: str, path: str, body: dict[str, Any] | None, field: str
) -> None:
    with api_node.client("admin") as admin:
        answer = admin.request(method, path, json=body)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"] == "invalid"
        assert field in answer.json()["detail"], answer.text
        # Nothing was set.
        assert all(
            limit["source"] == "settings" for limit in admin.get("/v1/limits").json()["limits"]
        )


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"rate": NaN}', "rate"),
        (b'{"rate": Infinity}', "rate"),
        (b'{"rate": 1e400}', "rate"),
        (b'{"max_inflight": true}', "max_inflight"),
        (b'{"max_inflight": 1, "reason": null}', "reason"),
        (b"[1]", "body"),
        (b"{", "body"),
    ],
)
def test_an_odd_body_is_a_422_not_a_500(api_node: RunningNode, raw: bytes, field: str) -> None:
    with api_node.client("admin") as admin:
        answer = admin.put(
            "/v1/limits/key/k", content=raw, headers={"Content-Type": "application/json"}
        )
    assert answer.status_code == 422, answer.text
    assert field in answer.json()["detail"], answer.text


@pytest.mark.parametrize("target", ["%00", "%C3%A9t%C3%A9", "%FF", "%2E%2E", "%2E", "a%2F..%2Fb"])
def test_an_odd_target_is_answered_not_a_500(api_node: RunningNode, target: str) -> None:
    with api_node.client("admin") as admin:
        for scope in ("client", "exec", "key"):
            path = f"/v1/limits/{scope}/{target}"
            put = admin.put(path, json={"max_inflight": 1})
            assert put.status_code in (200, 422), put.text
            assert admin.get(path).status_code in (200, 404, 422)
            assert admin.delete(path).status_code in (200, 422)


@pytest.mark.parametrize(
    ("key", "problem"),
    [("a*", "'*'"), ("", "characters"), ("k" * 201, "characters"), ("a\nb", "control"),
     (42, "")],
)  # fmt: skip
def test_a_bad_key_on_submit_is_refused_with_422_naming_it(
    api_node: RunningNode, key: object, problem: str
) -> None:
    with api_node.client("client") as client:
        single = client.post("/v1/jobs", json={"id": "bad-key", "exec": "a.b", "key": key})
        assert single.status_code == 422, single.text
        assert "body.key" in single.json()["detail"] and problem in single.json()["detail"]
        jobs = [{"id": "fine", "exec": "a.b", "key": "ok"},
                {"id": "bad-key", "exec": "a.b", "key": key}]  # fmt: skip
        batch = client.post("/v1/jobs:batch", json={"jobs": jobs})
        assert batch.status_code == 422, batch.text
        assert "body.jobs[1].key" in batch.json()["detail"]
    assert api_node.submitted_keys() == [], "nothing was written"


def test_a_kafka_record_carries_a_key_and_a_bad_one_is_rejected_naming_it(
    api_node: RunningNode,
) -> None:
    assert api_node.memory is not None
    good = {"id": "kafka-keyed", "exec": "lim.kafka", "payload": None, "key": "account:9"}
    api_node.memory.append_submission(b"kafka-keyed", json.dumps(good).encode())
    bad = {"id": "kafka-bad", "exec": "lim.kafka", "payload": None, "key": "account:*"}
    api_node.memory.append_submission(b"kafka-bad", json.dumps(bad).encode())
    api_node.wait_known("kafka-keyed")
    with api_node.client("admin") as admin:
        assert admin.get("/v1/jobs/kafka-keyed").json()["key"] == "account:9"
    [rejection] = api_node.rejections(1)
    assert rejection.reason.startswith("key:"), rejection.reason


def test_only_an_admin_reads_or_changes_limits(api_node: RunningNode) -> None:
    with api_node.client("client") as client, api_node.client("worker") as worker:
        for caller in (client, worker):
            assert caller.get("/v1/limits").status_code == 403
            assert caller.get("/v1/limits/key/a").status_code == 403
            assert caller.put("/v1/limits/key/a", json={"max_inflight": 1}).status_code == 403
            assert caller.delete("/v1/limits/key/a").status_code == 403


def test_each_change_records_the_admin_keys_name(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin:
        _put(admin, "client/globex", rate=5, burst=2, reason="noisy")
        assert admin.delete("/v1/limits/client/globex").json()["removed"] is True
    assert api_node.memory is not None
    events = [event for batch in api_node.memory.batches() for event in batch.events]
    [limit_set] = [event for event in events if isinstance(event, LimitSet)]
    [limit_removed] = [event for event in events if isinstance(event, LimitRemoved)]
    assert limit_set.by == limit_removed.by == "dev-admin"
    assert (limit_set.target, limit_set.reason, limit_set.burst) == ("globex", "noisy", 2)


# --- a real process: a follower, a restart -----------------------------------------------------


@pytest.fixture
def service(broker_api_settings: Settings, tmp_path: Path) -> Iterator[ServiceProcess]:
    """A node whose attempts do not time out while the test holds them; a silent worker is
    still lost after 3 s (the killed leader's worker, whose attempt is then requeued)."""
    dispatcher = broker_api_settings.dispatcher.model_copy(
        update={"ack_timeout_s": 60.0, "max_ack_timeout_s": 60.0}
    )
    settings = broker_api_settings.model_copy(update={"dispatcher": dispatcher})
    with killable_service(settings, tmp_path / "service.log") as process:
        yield process


def test_a_limit_survives_a_kill_9(service: ServiceProcess) -> None:
    """The new leader rebuilds the limits in force from the log: the key limit still holds,
    and its removal still works."""
    service.start()
    with service_client(service, "admin") as admin, service_client(service, "worker") as worker:
        _put(admin, "key/survivor", max_inflight=1, reason="kept")
        for n in range(3):
            _submit(admin, f"sv{n}", "lim.kill", key="survivor")
        [first] = poll_until(worker, "w1", ALL, 1)
        assert poll(worker, "w1", ALL, credits=3, wait_s=0.5) == []

    service.kill()
    service.start()

    with service_client(service, "admin") as admin, service_client(service, "worker") as worker:
        view = admin.get("/v1/limits/key/survivor").json()
        assert (view["max_inflight"], view["reason"], view["by"]) == (1, "kept", "dev-admin")
        # The first job's attempt was lost with the old leader; one at a time still.
        started = poll_until(worker, "w2", ALL, 1, timeout_s=60)
        assert poll(worker, "w2", ALL, credits=3, wait_s=1.0) == []
        removed = admin.delete("/v1/limits/key/survivor")
        assert removed.json() == {"removed": True, "limit": None}
        rest = poll_until(worker, "w2", ALL, 2, timeout_s=60)
        assert len({str(a["id"]) for a in started + rest}) == 3
        assert first["id"] in {"sv0", "sv1", "sv2"}


def test_a_follower_relays_limit_calls_and_keeps_the_limits_when_it_takes_over(
    broker_api_settings: Settings, tmp_path: Path
) -> None:
    ensure_dev_keys(broker_api_settings.auth)
    one = ServiceProcess(broker_api_settings, free_port(), tmp_path / "one.log")
    other = ServiceProcess(broker_api_settings, free_port(), tmp_path / "other.log")
    try:
        leader, follower = start_a_pair(one, other)
        with (
            service_client(follower, "admin") as through_follower,
            service_client(leader, "admin") as on_leader,
        ):
            deadline = time.monotonic() + 30
            while through_follower.get("/v1/leader").json()["leader"] != leader.url:
                assert time.monotonic() < deadline, "the follower never saw the leader"
                time.sleep(0.1)
            set_there = through_follower.put(
                "/v1/limits/key/relayed:1", json={"max_inflight": 4, "reason": "via follower"}
            )
            assert set_there.status_code == 200, set_there.text
            assert set_there.json() == on_leader.get("/v1/limits/key/relayed:1").json()
            assert set_there.json()["by"] == "dev-admin"
            refused = through_follower.put("/v1/limits/key/relayed:1", json={"rate": 0})
            assert refused.status_code == 422 and "rate" in refused.json()["detail"]
            listed = through_follower.get("/v1/limits").json()["limits"]
            assert [limit["target"] for limit in listed] == ["relayed:1"]
            removed = through_follower.delete("/v1/limits/key/relayed:1")
            assert removed.json() == {"removed": True, "limit": None}
            assert on_leader.get("/v1/limits").json()["limits"] == []
            kept = {"max_inflight": 2, "rate": 3.0, "reason": "over the failover"}
            assert through_follower.put("/v1/limits/exec/ha.>", json=kept).status_code == 200

        # The follower takes over: its rebuild restores the limit the other node set.
        leader.kill()
        follower.wait("/readyz", 60)
        with service_client(follower, "admin") as new_leader:
            view = new_leader.get("/v1/limits/exec/ha.>").json()
            assert (view["max_inflight"], view["rate"], view["burst"]) == (2, 3.0, 3)
            assert (view["reason"], view["by"]) == ("over the failover", "dev-admin")
    finally:
        one.stop()
        other.stop()

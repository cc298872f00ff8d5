"""`POST /v1/jobs` answered by `dispatch.api.submit_fast_path` gives the route's own answers.

A query string (`?x=1`) sends the same request through FastAPI's route instead, so each
answer of the fast path is compared with the route's answer to the same request."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.integration.api.conftest import RunningNode

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}
UNSERVED = {"warning": "no worker serves exec 'a.b' now: the job waits until one does"}
"""What a submission answer adds while no worker serves its exec (none does in this module)."""


def test_a_submission_is_answered_202_queued_with_a_content_length(
    api_node: RunningNode,
) -> None:
    with api_node.client("client") as client, api_node.client("admin") as admin:
        answer = client.post("/v1/jobs", json={"id": "fast-1", "exec": "a.b", "payload": [1]})
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"id": "fast-1", "status": "queued", "existing": False, **UNSERVED}
        assert answer.headers["content-length"] == str(len(answer.content))
        assert answer.headers["content-type"] == "application/json"
        api_node.wait_known("fast-1")
        job = admin.get("/v1/jobs/fast-1").json()
        assert (job["client_id"], job["exec"], job["payload"]) == ("dev", "a.b", [1])

        generated = client.post("/v1/jobs", json={"exec": "a.b"})
        assert generated.status_code == 202, generated.text
        assert len(generated.json()["id"]) == 32
    assert sorted(api_node.submitted_keys()) == sorted([b"fast-1", generated.json()["id"].encode()])


def test_the_same_id_again_is_answered_200_with_the_existing_job(api_node: RunningNode) -> None:
    with api_node.client("client") as client, api_node.client("admin") as admin:
        first = client.post("/v1/jobs", json={"id": "again", "exec": "a.b", "payload": 1})
        assert first.status_code == 202, first.text
        api_node.wait_known("again")
        repeat = client.post("/v1/jobs", json={"id": "again", "exec": "a.b", "payload": 2})
        assert repeat.status_code == 200, repeat.text
        assert repeat.json() == {"id": "again", "status": "queued", "existing": True, **UNSERVED}
        assert repeat.headers["content-length"] == str(len(repeat.content))
        assert admin.get("/v1/jobs/again").json()["payload"] == 1
        assert client.post("/v1/jobs?x=1", json={"id": "again", "exec": "a.b"}).json() == (
            repeat.json()
        )
    assert api_node.submitted_keys() == [b"again"]


def test_a_refused_field_is_named_as_the_batch_route_names_it(api_node: RunningNode) -> None:
    with api_node.client("client") as client:
        for job, field_name in (
            (b'{"exec": "a..b"}', "exec"),
            (b'{"exec": "a.b", "id": "a/b"}', "id"),
            (b'{"exec": "a.b", "max_attempts": 0}', "max_attempts"),
            (b'{"exec": "a.b", "payload": {"x": Infinity}}', "payload.x"),
        ):
            one = client.post("/v1/jobs", content=job, headers=JSON)
            batch = client.post("/v1/jobs:batch", content=b'{"jobs": [%s]}' % job, headers=JSON)
            assert (one.status_code, batch.status_code) == (422, 422), (one.text, batch.text)
            assert one.json()["error"] == batch.json()["error"] == "invalid"
            detail = one.json()["detail"]
            assert detail.startswith(f"body.{field_name}: "), detail
            assert detail == batch.json()["detail"].replace("body.jobs[0].", "body.")
    assert api_node.submitted_keys() == []


@dataclass
class Case:
    """One request, sent once to the fast path and once (with `?x=1`) to the route."""

    name: str
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=lambda: [*JSON.items()])
    key: str | tuple[str, ...] | None = "client"
    """The role whose key is sent (None: no Authorization header; several: one header each,
    in that order)."""
    status: int = 0
    """The status both are expected to answer."""


def _deep(depth: int) -> bytes:
    return b'{"exec":"a.b","payload":' + b"[" * depth + b"]" * depth + b"}"


CASES = [
    Case("valid with an id", b'{"id":"{id}","exec":"a.b","payload":{"k":[1,2]}}', status=202),
    Case("valid, admin key", b'{"id":"{id}","exec":"a.b","client_id":"other"}', key="admin",
         status=202),
    Case("valid, charset", b'{"id":"{id}","exec":"a.b"}', status=202,
         headers=[("Content-Type", "application/json; charset=utf-8")]),
    Case("no key", b'{"exec":"a.b"}', key=None, status=401),
    Case("unknown key", b'{"exec":"a.b"}', key="nobody", status=401),
    Case("a basic scheme", b'{"exec":"a.b"}', key="basic", status=401),
    Case("a worker key", b'{"exec":"a.b"}', key="worker", status=403),
    Case("a worker key, then a client key", b'{"exec":"a.b"}', key=("worker", "client"),
         status=403),
    Case("a client key, then a worker key", b'{"id":"{id}","exec":"a.b"}',
         key=("client", "worker"), status=202),
    Case("another client's client_id", b'{"exec":"a.b","client_id":"other"}', status=403),
    Case("an id taken by another client", b'{"id":"taken","exec":"a.b"}', status=409),
    Case("an unknown field", b'{"exec":"a.b","max_attempt":3}', status=422),
    Case("a missing field", b'{"payload":1}', status=422),
    Case("a wrong type", b'{"exec":"a.b","priority":"5"}', status=422),
    Case("a refused exec", b'{"exec":"a..b"}', status=422),
    Case("NaN", b'{"exec":"a.b","payload":NaN}', status=422),
    Case("not JSON", b'{"exec": "a.b",', status=422),
    Case("not UTF-8", b'{"exec":"a.b","payload":"\xff"}', status=400),
    Case("nested too deep to parse", _deep(100_000), status=400),
    Case("a JSON array", b'[{"exec":"a.b"}]', status=422),
    Case("an empty body", b"", status=422),
    Case("text/plain", b'{"exec":"a.b"}', headers=[("Content-Type", "text/plain")], status=422),
    Case("text/plain, then JSON", b'{"exec":"a.b"}', status=422,
         headers=[("Content-Type", "text/plain"), ("Content-Type", "application/json")]),
    Case("no content type", b'{"exec":"a.b"}', headers=[], status=422),
]  # fmt: skip


def _authorization(api_node: RunningNode, key: str | tuple[str, ...] | None) -> list[str]:
    if key is None:
        return []
    if isinstance(key, tuple):
        return [value for role in key for value in _authorization(api_node, role)]
    if key == "nobody":
        return ["Bearer not-a-key"]
    if key == "basic":
        return [f"Basic {api_node.keys['client']}"]
    return [f"Bearer {api_node.keys[key]}"]


def _answer(api_node: RunningNode, case: Case, query: str, job_id: str) -> tuple[int, Any]:
    body = case.body.replace(b"{id}", job_id.encode())
    headers = list(case.headers)
    headers += [("Authorization", value) for value in _authorization(api_node, case.key)]
    # A connection of its own: a 500 would close a shared one under the next request.
    with httpx.Client(base_url=api_node.url, timeout=30) as http:
        answer = http.post(f"/v1/jobs{query}", content=body, headers=headers)
    assert answer.headers["content-length"] == str(len(answer.content)), case.name
    try:
        payload: Any = answer.json()
    except ValueError:
        payload = answer.text
    if isinstance(payload, dict) and payload.get("id") == job_id:
        payload["id"] = "{id}"
    return answer.status_code, payload


def test_every_answer_is_the_one_the_route_gives(api_node: RunningNode) -> None:
    with api_node.client("admin") as admin:
        taken = admin.post("/v1/jobs", json={"id": "taken", "exec": "a.b", "client_id": "other"})
        assert taken.status_code == 202, taken.text
        api_node.wait_known("taken")
    answers: dict[str, tuple[tuple[int, Any], tuple[int, Any]]] = {}
    for number, case in enumerate(CASES):
        fast = _answer(api_node, case, "", f"fast-{number}")
        route = _answer(api_node, case, "?x=1", f"route-{number}")
        answers[case.name] = (fast, route)
    different = {name: pair for name, pair in answers.items() if pair[0] != pair[1]}
    assert different == {}
    statuses = {name: fast[0] for name, (fast, _route) in answers.items()}
    assert statuses == {case.name: case.status for case in CASES}
    # Only what was accepted was written to Kafka (a refusal, on either path, writes nothing).
    accepted = [n for n, case in enumerate(CASES) if case.status == 202]
    written = ["taken", *(f"{side}-{n}" for n in accepted for side in ("fast", "route"))]
    assert sorted(api_node.submitted_keys()) == sorted(key.encode() for key in written)


def test_a_body_sent_in_several_chunks_is_accepted(api_node: RunningNode) -> None:
    def chunks() -> Iterator[bytes]:
        for chunk in (b'{"id": "chun', b'ked", "exec"', b': "a.b", "payload"', b": [1, 2]}"):
            yield chunk
            time.sleep(0.05)  # separate writes: separate ASGI body messages

    with api_node.client("client") as client, api_node.client("admin") as admin:
        answer = client.post("/v1/jobs", content=chunks(), headers=JSON)
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"id": "chunked", "status": "queued", "existing": False, **UNSERVED}
        api_node.wait_known("chunked")
        assert admin.get("/v1/jobs/chunked").json()["payload"] == [1, 2]

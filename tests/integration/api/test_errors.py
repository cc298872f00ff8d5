"""Errors of a real node: an oversized body without a length is a 413, and a follower's 307
(a worker route's) names the request exactly as the client sent it, encoded."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from dispatch.api.memory_log import MemoryLog
from dispatch.settings import Settings
from tests.integration.api.conftest import RunningNode, start_node, stop_node

pytestmark = pytest.mark.integration


def test_an_oversized_chunked_body_is_refused_with_413(api_node: RunningNode) -> None:
    limit = api_node.settings.api.max_payload_bytes

    def chunks() -> Iterator[bytes]:
        yield b'{"id": "big", "exec": "a.b", "payload": "'
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    with api_node.client("admin") as admin:
        answer = admin.post(
            "/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"] == "too_large"
        # A chunked body under the limit is read as usual.
        small = admin.post(
            "/v1/jobs",
            content=iter([b'{"id": "small", ', b'"exec": "a.b"}']),
            headers={"Content-Type": "application/json"},
        )
        assert small.status_code == 202, small.text


@pytest.fixture
def leader_and_follower(api_settings: Settings) -> Iterator[tuple[RunningNode, RunningNode]]:
    # Two nodes of one group share one log.
    shared_log = MemoryLog(api_settings)
    leader, leader_server, leader_thread = start_node(api_settings, io=shared_log)
    try:
        follower, follower_server, follower_thread = start_node(
            api_settings, wait_ready=False, io=shared_log
        )
        try:
            deadline = time.monotonic() + 30
            while httpx.get(f"{follower.url}/readyz").json().get("leader") != leader.url:
                assert time.monotonic() < deadline, "the follower never saw the leader"
                time.sleep(0.2)
            yield leader, follower
        finally:
            stop_node(follower_server, follower_thread)
    finally:
        stop_node(leader_server, leader_thread)


def test_a_followers_307_location_is_the_encoded_request(
    leader_and_follower: tuple[RunningNode, RunningNode],
) -> None:
    # Worker routes answer 307 on a follower (client calls are relayed to the leader).
    leader, follower = leader_and_follower
    poll = {"subjects": ["job.assign.>"], "credits": 0, "wait_s": 0}
    with follower.client("admin") as admin:
        for target in (
            "/v1/workers/caf%C3%A9-%E2%9C%93/poll",  # not Latin-1: was a 500
            "/v1/workers/x%0d%0aSet-Cookie:%20a=b/poll",  # CR LF: must stay encoded
            "/v1/workers/w/poll?x=%0D%0A&y=%C3%A9",
        ):
            answer = admin.post(target, json=poll)
            assert answer.status_code == 307, (target, answer.text)
            assert answer.headers["location"] == leader.url + target
            assert "set-cookie" not in answer.headers
            assert answer.json()["leader"] == leader.url

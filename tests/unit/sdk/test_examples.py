"""The demo handlers, called directly."""

from __future__ import annotations

import asyncio

import pytest

from dispatch.worker.examples import app, echo, fail, flaky, sleep, stall
from dispatch.worker.jobs import Assignment, PermanentError, Retry


def _job(exec_name: str, payload: object = None, attempt: int = 1) -> Assignment:
    return Assignment(id="j", exec=exec_name, payload=payload, attempt=attempt, deadline=0.0,
                      lease="L", worker_id="w")  # fmt: skip


def test_the_demo_app_serves_the_demo_execs() -> None:
    assert app.subjects == [f"job.assign.demo.{name}"
                            for name in ("echo", "sleep", "fail", "flaky", "stall")]  # fmt: skip
    route = app.handlers.route("demo.stall")
    assert route is not None and route.handler.heartbeat is False


def test_echo_sleep_and_stall_return_what_they_did() -> None:
    assert echo(_job("demo.echo", {"a": [1]})) == {"a": [1]}
    assert asyncio.run(sleep(_job("demo.sleep", {"seconds": 0}))) == {"slept": 0.0}
    assert asyncio.run(stall(_job("demo.stall", {"seconds": 0.01}))) == {"stalled": 0.01}
    for bad in ({"seconds": "soon"}, {"seconds": -1}):
        with pytest.raises(PermanentError, match=r"payload\.seconds"):
            asyncio.run(sleep(_job("demo.sleep", bad)))


def test_fail_is_permanent_and_flaky_fails_once() -> None:
    with pytest.raises(PermanentError, match="always fails"):
        fail(_job("demo.fail"))
    with pytest.raises(PermanentError, match="my reason"):
        fail(_job("demo.fail", {"reason": "my reason"}))
    with pytest.raises(Retry):
        flaky(_job("demo.flaky", attempt=1))
    assert flaky(_job("demo.flaky", attempt=2)) == {"attempt": 2}

"""The worker app's configuration and the heartbeat schedule (the runtime itself runs in
tests/integration/sdk against a real node)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from dispatch.worker.jobs import Assignment
from dispatch.worker.sdk import (
    MIN_HEARTBEAT_PAUSE_S,
    WorkerApp,
    WorkerError,
    default_worker_id,
    heartbeat_pause,
)


def test_heartbeats_come_every_third_of_the_time_left() -> None:
    assert heartbeat_pause(deadline=130.0, now=100.0) == pytest.approx(10.0)
    assert heartbeat_pause(deadline=101.0, now=100.0) == pytest.approx(1 / 3)
    assert heartbeat_pause(deadline=99.0, now=100.0) == MIN_HEARTBEAT_PAUSE_S  # late: at once


def _app() -> WorkerApp:
    app = WorkerApp("unit", concurrency=3, grace_s=7.0)

    @app.handler("image.*")
    def sync_handler(job: Assignment) -> Any:
        return job.payload

    @app.handler("report.>", heartbeat=False)
    async def async_handler(job: Assignment) -> Any:
        return job.payload

    class Callable:
        async def __call__(self, job: Assignment) -> Any:
            return None

    app.add_handler("misc.call", Callable())
    return app


def test_handlers_are_registered_with_their_kind() -> None:
    app = _app()
    specs = {pattern: app.handlers.route(pattern.replace("*", "x").replace(">", "x"))
             for pattern in ("image.*", "report.>", "misc.call")}  # fmt: skip
    assert {pattern: (route.handler.is_async, route.handler.heartbeat)
            for pattern, route in specs.items() if route} == {
        "image.*": (False, True), "report.>": (True, False), "misc.call": (True, True),
    }  # fmt: skip
    assert app.subjects == ["job.assign.image.*", "job.assign.report.>", "job.assign.misc.call"]


def test_options_take_the_apps_defaults_and_the_runs_overrides() -> None:
    app = _app()
    options = app.options()
    assert (options.concurrency, options.grace_s, options.transport) == (3, 7.0, "ws")
    assert options.subjects == app.subjects
    assert options.worker_id.startswith("unit-") and str(os.getpid()) in options.worker_id
    chosen = app.options(
        subjects=["job.assign.image.resize", "job.assign.image.resize"], concurrency=1,
        transport="rest", worker_id="w9", grace_s=0,
    )  # fmt: skip
    assert (chosen.subjects, chosen.concurrency, chosen.transport, chosen.worker_id) == (
        ["job.assign.image.resize"], 1, "rest", "w9",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"subjects": ["job.assign.video.*"]}, "not covered by a handler"),
        ({"subjects": ["image.*"]}, "subject pattern such as"),
        ({"concurrency": 0}, "concurrency"),
        ({"transport": "pigeon"}, "transport"),
        ({"keepalive_s": 0}, "keepalive_s"),
    ],
)
def test_bad_options_are_refused_before_anything_connects(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(WorkerError, match=message):
        _app().options(**overrides)
    with pytest.raises(WorkerError, match="no handlers"):
        WorkerApp("empty").options()


def test_worker_ids_are_unique_per_call() -> None:
    assert default_worker_id("w") != default_worker_id("w")


def test_a_stop_before_the_run_is_kept_for_it() -> None:
    app = _app()
    app.stop(grace_s=1.5)
    assert app._stop_early == 1.5

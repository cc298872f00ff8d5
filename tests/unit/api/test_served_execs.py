"""Which execs the connected workers serve, as the hub learns it from each commit (the submit
answer's warning): joins and losses change it, a term's end forgets it. Against a real node:
tests/integration/sdk/test_tasks.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from dispatch.api.hub import Hub
from dispatch.api.metrics import Metrics
from dispatch.api.served_execs import MAX_CACHED_EXECS, ServedExecs, unserved_warning
from dispatch.core.subjects import compile_pattern
from tests.unit.core.helpers import T0, make


@pytest.fixture
def hub() -> Iterator[Hub]:
    loop = asyncio.new_event_loop()
    try:
        yield Hub(loop, Metrics())
    finally:
        loop.close()


def test_a_node_that_leads_no_term_warns_about_nothing(hub: Hub) -> None:
    assert hub.served.serves("image.resize") is None
    assert hub.served.warning("image.resize") is None


def test_joins_and_losses_change_what_is_served(hub: Hub) -> None:
    core = make()
    hub.committed(core, core.begin_epoch(1, T0))
    assert hub.served.warning("image.resize") == unserved_warning("image.resize")
    assert unserved_warning("image.resize") == (
        "no worker serves exec 'image.resize' now: the job waits until one does"
    )

    hub.committed(core, core.join("w1", ["job.assign.image.*"], T0))
    hub.committed(core, core.join("w2", ["job.assign.report.>"], T0))
    assert hub.served.serves("image.resize") is True
    assert hub.served.serves("report.daily.pdf") is True
    assert hub.served.serves("image.resize.big") is False  # `*` is one token
    assert hub.served.warning("image.resize") is None

    hub.committed(core, core.join("w1", ["job.assign.video.*"], T0 + 1))  # new subjects
    assert hub.served.serves("image.resize") is False
    assert hub.served.serves("video.cut") is True

    hub.committed(core, core.lose_worker("w1", T0 + 2))
    assert hub.served.serves("video.cut") is False
    assert hub.served.serves("report.x") is True


def test_the_end_of_a_term_forgets_the_workers(hub: Hub) -> None:
    core = make()
    hub.committed(core, core.begin_epoch(1, T0) + core.join("w1", ["job.assign.a"], T0))
    assert hub.served.serves("a") is True
    hub.stopped(None)
    assert hub.served.serves("a") is None  # maybe a follower now: no knowledge, no warning


def test_answers_are_cached_per_set_of_patterns_and_bounded() -> None:
    served = ServedExecs()
    patterns = frozenset({compile_pattern("job.assign.a.*")})
    served.refresh(patterns)
    assert served.serves("a.b") is True
    cached = served._view
    served.refresh(frozenset(patterns))  # the same patterns: the cache stays
    assert served._view is cached
    served.refresh(frozenset({compile_pattern("job.assign.b")}))
    assert served.serves("a.b") is False and served.serves("b") is True
    for n in range(MAX_CACHED_EXECS + 10):
        assert served.serves(f"x{n}") is False
    assert served._view is not None and len(served._view.answers) == MAX_CACHED_EXECS

"""Worker commands: join, credit, heartbeat, loss."""

from __future__ import annotations

import pytest

from dispatch.core import (
    RejectCode,
    Rejected,
)
from tests.unit.core.helpers import (
    T0,
    make,
    request,
    types,
    worker,
)


def test_rejoining_with_new_subjects_changes_routing() -> None:
    d = make()
    worker(d, "w", ["job.assign.mail.*"], credits=5)
    d.submit(request("j1", "image.resize"), T0)
    events = d.join("w", ["job.assign.image.*"], T0 + 1)
    assert types(events) == ["worker_joined", "assigned"]


def test_join_with_a_bad_pattern_is_rejected() -> None:
    d = make()
    for bad in ([], ["job..x"], ["job.>.x"], ["job.a*"]):
        with pytest.raises(Rejected) as caught:
            d.join("w", bad, T0)
        assert caught.value.code is RejectCode.INVALID
    assert d.workers() == []


def test_replace_credit_sets_the_exact_credit() -> None:
    d = make()
    worker(d, "w", credits=5)
    d.grant_credit("w", 2, T0, replace=True)
    assert d.worker("w").credit == 2  # type: ignore[union-attr]
    d.grant_credit("w", 0, T0, replace=True)
    assert d.worker("w").credit == 0  # type: ignore[union-attr]


def test_credit_for_an_unknown_worker_is_rejected() -> None:
    d = make()
    with pytest.raises(Rejected) as caught:
        d.grant_credit("ghost", 1, T0)
    assert caught.value.code is RejectCode.UNKNOWN_WORKER and caught.value.http_status == 404


@pytest.mark.parametrize("credits", [0, -1, 10**7, True, 1.5])
def test_credit_must_be_a_positive_integer(credits: int) -> None:
    d = make()
    worker(d, "w")
    with pytest.raises(Rejected) as caught:
        d.grant_credit("w", credits, T0)
    assert caught.value.code is RejectCode.INVALID


def test_worker_heartbeat_keeps_the_worker_alive() -> None:
    d = make(worker_expiry_s=15.0)
    worker(d, "w")
    d.worker_heartbeat("w", T0 + 10)
    assert d.tick(T0 + 20) == []
    assert types(d.tick(T0 + 25)) == ["worker_lost"]


def test_losing_an_unknown_worker_is_rejected() -> None:
    d = make()
    with pytest.raises(Rejected) as caught:
        d.lose_worker("ghost", T0)
    assert caught.value.code is RejectCode.UNKNOWN_WORKER
    with pytest.raises(Rejected):
        d.worker_heartbeat("ghost", T0)

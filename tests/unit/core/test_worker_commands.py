"""Worker commands: join, credit, heartbeat, loss."""

from __future__ import annotations

import pytest

from dispatch.core import (
    RejectCode,
    Rejected,
    WorkerJoined,
    decode_events,
    encode_events,
    state_view,
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


# --- worker ids bound to the key that joined them ---------------------------------------------


def test_a_join_by_another_key_is_forbidden_and_the_worker_keeps_everything() -> None:
    d = make()
    d.join("w1", ["job.assign.image.*"], T0, owner="k1")
    d.grant_credit("w1", 3, T0)
    d.submit(request("j1", "image.resize"), T0)
    before = state_view(d)
    with pytest.raises(Rejected) as caught:
        d.join("w1", ["job.assign.>"], T0 + 1, owner="k2")
    assert caught.value.code is RejectCode.FORBIDDEN and caught.value.http_status == 403
    assert caught.value.detail == "worker 'w1' belongs to another key"
    assert state_view(d) == before
    record = d.worker("w1")
    assert record is not None and record.subjects == ("job.assign.image.*",)
    assert record.running == ("j1",) and record.credit == 2 and d.worker_owner("w1") == "k1"
    # Its own key joins again as before.
    assert types(d.join("w1", ["job.assign.>"], T0 + 2, owner="k1")) == ["worker_joined"]


def test_a_join_without_an_owner_keeps_the_recorded_one() -> None:
    d = make()
    d.join("w1", ["job.assign.>"], T0, owner="k1")
    (joined,) = d.join("w1", ["job.assign.a.*"], T0 + 1)  # an admin's join
    assert isinstance(joined, WorkerJoined) and joined.owner is None
    assert d.worker_owner("w1") == "k1"
    with pytest.raises(Rejected):
        d.join("w1", ["job.assign.>"], T0 + 2, owner="k2")


def test_a_worker_with_no_known_owner_takes_the_first_key_that_joins_it() -> None:
    d = make()
    d.join("w1", ["job.assign.>"], T0)
    assert d.worker_owner("w1") is None
    d.join("w1", ["job.assign.>"], T0 + 1, owner="k2")
    assert d.worker_owner("w1") == "k2"
    with pytest.raises(Rejected) as caught:
        d.join("w1", ["job.assign.>"], T0 + 2, owner="k1")
    assert caught.value.code is RejectCode.FORBIDDEN


def test_a_lost_worker_id_may_be_joined_by_any_key() -> None:
    d = make()
    d.join("w1", ["job.assign.>"], T0, owner="k1")
    d.lose_worker("w1", T0 + 1)
    assert d.worker_owner("w1") is None
    d.join("w1", ["job.assign.>"], T0 + 2, owner="k2")
    assert d.worker_owner("w1") == "k2"


@pytest.mark.parametrize("owner", ["", 7])
def test_an_owner_must_be_a_non_empty_string(owner: object) -> None:
    d = make()
    with pytest.raises(Rejected) as caught:
        d.join("w1", ["job.assign.>"], T0, owner=owner)  # type: ignore[arg-type]
    assert caught.value.code is RejectCode.INVALID
    assert d.workers() == []


def test_the_owner_survives_a_replay_of_the_events() -> None:
    d = make()
    events = d.join("w1", ["job.assign.>"], T0, owner="k1")
    events += d.join("w1", ["job.assign.a.*"], T0 + 1)  # admin: keeps k1
    events += d.join("w2", ["job.assign.>"], T0 + 1)  # admin: no owner
    events += d.join("w2", ["job.assign.>"], T0 + 2, owner="k2")  # claimed
    replica = make()
    replica.apply_all(decode_events(encode_events(events)))
    assert (replica.worker_owner("w1"), replica.worker_owner("w2")) == ("k1", "k2")
    assert state_view(replica) == state_view(d)
    with pytest.raises(Rejected) as caught:
        replica.join("w1", ["job.assign.>"], T0 + 3, owner="k2")
    assert caught.value.code is RejectCode.FORBIDDEN

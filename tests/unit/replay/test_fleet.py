"""The simulated fleet: the recorded workers, or N identical ones."""

from __future__ import annotations

import pytest

from dispatch.replay.fleet import FleetWorker, recorded_fleet, typical_slots, uniform_fleet
from dispatch.replay.model import History, RecordedWorker


def history(*workers: RecordedWorker) -> History:
    return History(since=0.0, until=1.0, jobs=(), workers=workers, events=())


def test_the_recorded_fleet_keeps_each_workers_subjects_slots_and_lifetime() -> None:
    recorded = RecordedWorker("w1", ("job.assign.demo.>",), 3, joined_at=5.0, left_at=9.0)
    (worker,) = recorded_fleet(history(recorded))
    assert worker == FleetWorker("w1", ("job.assign.demo.>",), 3, joins_at=5.0, leaves_at=9.0)


def test_a_uniform_fleet_has_n_named_workers_present_throughout() -> None:
    fleet = uniform_fleet(10, 4)
    assert [worker.worker_id for worker in fleet][:2] == ["sim-01", "sim-02"]
    assert len(fleet) == 10
    assert all(w.slots == 4 and w.joins_at is None and w.leaves_at is None for w in fleet)
    assert fleet[0].subjects == ("job.assign.>",)


def test_typical_slots_is_the_recorded_median_or_one() -> None:
    workers = [
        RecordedWorker(f"w{n}", ("job.assign.>",), slots, None, None)
        for n, slots in enumerate((1, 8, 4))
    ]
    assert typical_slots(history(*workers)) == 4
    assert typical_slots(history()) == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: uniform_fleet(0, 1), "workers: expected an integer >= 1"),
        (lambda: uniform_fleet(1, 0), "slots must be an integer >= 1"),
        (lambda: uniform_fleet(1, 1, ["job.assign..bad"]), "job.assign..bad"),
    ],
)
def test_a_bad_fleet_is_refused_with_a_message(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        make()  # type: ignore[operator]

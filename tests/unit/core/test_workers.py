"""Worker choice and the worker snapshot format."""

from __future__ import annotations

import pytest

from dispatch.core import WorkerRecord
from dispatch.core.workers import WorkerState, pick_worker


def state(worker_id: str, credit: int, running: int = 0) -> WorkerState:
    worker = WorkerState(worker_id, ("job.assign.>",), 0.0)
    worker.credit = credit
    for n in range(running):
        worker.running[f"{worker_id}-{n}"] = None  # type: ignore[assignment]
    return worker


def test_fewest_running_wins_then_most_credit_then_smallest_id() -> None:
    workers = [state("a", 1, running=2), state("b", 1, running=1), state("c", 5, running=1)]
    assert pick_worker(workers) is workers[2]
    assert pick_worker([state("b", 2), state("a", 2)]).worker_id == "a"  # type: ignore[union-attr]


def test_workers_without_credit_and_the_excluded_one_are_skipped() -> None:
    broke, excluded = state("broke", 0), state("excluded", 3)
    assert pick_worker([broke, excluded], exclude=excluded) is None
    assert pick_worker([]) is None


def test_matching_uses_every_pattern() -> None:
    worker = WorkerState("w", ("job.assign.mail.*", "job.assign.image.>"), 0.0)
    assert worker.matches(("job", "assign", "image", "a", "b"))
    assert not worker.matches(("job", "assign", "video", "a"))


def test_worker_record_round_trips_and_validates() -> None:
    record = WorkerRecord(
        worker_id="w", subjects=("job.>",), credit=3, last_seen=5.0, running=("j",)
    )
    assert WorkerRecord.from_dict(record.to_dict()) == record
    with pytest.raises(ValueError, match=r"worker\.subjects"):
        WorkerRecord.from_dict({"worker_id": "w", "subjects": ["a..b"]})
    with pytest.raises(ValueError, match=r"worker\.credit"):
        WorkerRecord.from_dict({"worker_id": "w", "subjects": ["a"], "credit": -1})


def test_worker_record_carries_its_owner() -> None:
    record = WorkerRecord(worker_id="w", subjects=("job.>",), owner="k1")
    assert record.to_dict()["owner"] == "k1"
    assert WorkerRecord.from_dict(record.to_dict()) == record
    assert WorkerRecord.from_dict({"worker_id": "w", "subjects": ["a"]}).owner is None
    with pytest.raises(ValueError, match=r"worker\.owner"):
        WorkerRecord.from_dict({"worker_id": "w", "subjects": ["a"], "owner": 3})

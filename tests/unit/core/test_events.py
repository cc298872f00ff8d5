"""Events: plain-dict round trips, validation that names the bad field, immutability."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from dispatch.core import (
    EVENT_TYPES,
    Assigned,
    Cancelled,
    Enqueued,
    JobEvent,
    WorkerJoined,
    event_from_dict,
)
from tests.unit.core.samples import SAMPLES


def test_every_event_type_has_a_sample() -> None:
    assert {type(event).type for event in SAMPLES} == set(EVENT_TYPES)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda event: event.type)
def test_to_dict_round_trips_through_json(event: Any) -> None:
    data = event.to_dict()
    assert data["type"] == event.type and data["epoch"] == 3
    decoded = event_from_dict(json.loads(json.dumps(data)))
    assert decoded == event and type(decoded) is type(event)


def test_job_events_carry_the_job_id() -> None:
    job_types = {type(event).type for event in SAMPLES if isinstance(event, JobEvent)}
    assert job_types == {
        "enqueued",
        "assigned",
        "reassigned",
        "job_heartbeat",
        "completed",
        "requeued",
        "dead_lettered",
        "cancel_requested",
        "cancelled",
        "expired",
        "redriven",
    }


def test_fields_with_defaults_may_be_left_out() -> None:
    event = event_from_dict({"type": "worker_lost", "epoch": 0, "at": 1, "worker_id": "w"})
    assert event.to_dict() == {
        "type": "worker_lost",
        "epoch": 0,
        "at": 1.0,
        "worker_id": "w",
        "reason": "",
    }


def _assigned(**changes: Any) -> dict[str, Any]:
    data = Assigned(
        epoch=1, at=2.0, job_id="j", worker_id="w", attempt=1, lease="1.1", deadline=3.0
    ).to_dict()
    data.update(changes)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"type": "exploded", "epoch": 0, "at": 0}, r"event\.type: unknown event type 'exploded'"),
        ({"epoch": 0, "at": 0}, r"event\.type: unknown event type None"),
        (_assigned(attempt=0), r"assigned\.attempt: expected an integer >= 1, got 0"),
        (_assigned(attempt="1"), r"assigned\.attempt: expected an integer"),
        (_assigned(lease=""), r"assigned\.lease"),
        (_assigned(deadline="soon"), r"assigned\.deadline: expected a number"),
        (_assigned(epoch=-1), r"assigned\.epoch"),
        (_assigned(at=None), r"assigned\.at"),
        (_assigned(job_id=""), r"assigned\.job_id"),
        (_assigned(color="red"), r"assigned: unknown field\(s\) \['color'\]"),
        (
            {k: v for k, v in _assigned().items() if k != "worker_id"},
            r"assigned\.worker_id: missing required field",
        ),
        (
            {
                "type": "requeued",
                "epoch": 0,
                "at": 0,
                "job_id": "j",
                "reason": "bored",
                "worker_id": "w",
                "attempt": 1,
                "seq": 1,
            },
            r"requeued\.reason: expected one of failed, worker_lost, timeout",
        ),
        (
            {
                "type": "worker_joined",
                "epoch": 0,
                "at": 0,
                "worker_id": "w",
                "subjects": ["job..x"],
            },
            r"worker_joined\.subjects",
        ),
        (
            {
                "type": "enqueued",
                "epoch": 0,
                "at": 0,
                "job_id": "j",
                "client_id": "c",
                "exec": "a.*",
                "payload": None,
                "max_attempts": 1,
                "timeout_s": 1,
                "seq": 1,
            },
            r"enqueued\.exec",
        ),
        (
            {"type": "cancelled", "epoch": 0, "at": 0, "job_id": "j", "worker_id": "w"},
            r"cancelled\.attempt: a running job's cancel names both",
        ),
        (
            {"type": "cancelled", "epoch": 0, "at": 0, "job_id": "j", "attempt": 1},
            r"cancelled\.attempt",
        ),
        (
            {
                "type": "cancel_requested",
                "epoch": 0,
                "at": 0,
                "job_id": "j",
                "worker_id": "w",
                "attempt": 0,
                "deadline": 1,
            },
            r"cancel_requested\.attempt",
        ),
    ],
)
def test_malformed_input_names_the_bad_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        event_from_dict(data)


def test_non_objects_are_refused() -> None:
    with pytest.raises(ValueError, match="JSON object"):
        event_from_dict(["assigned"])  # type: ignore[arg-type]


def test_events_are_frozen() -> None:
    event = SAMPLES[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.epoch = 9  # type: ignore[misc]


def test_a_join_carries_its_owner_and_one_without_is_written_as_before() -> None:
    owned = WorkerJoined(epoch=1, at=2.0, worker_id="w", subjects=("job.>",), owner="k1")
    assert owned.to_dict()["owner"] == "k1"
    assert event_from_dict(json.loads(json.dumps(owned.to_dict()))) == owned
    plain = WorkerJoined(epoch=1, at=2.0, worker_id="w", subjects=("job.>",))
    # No `owner` key at all: a log written before owners reads the same, and a node that
    # does not know the field reads what a join without an owner writes.
    assert plain.to_dict() == {
        "type": "worker_joined", "epoch": 1, "at": 2.0, "worker_id": "w", "subjects": ["job.>"]
    }  # fmt: skip
    assert event_from_dict(plain.to_dict()) == plain
    with pytest.raises(ValueError, match=r"worker_joined\.owner"):
        event_from_dict({**plain.to_dict(), "owner": 7})


def test_a_queued_jobs_cancel_is_written_as_before_and_old_ones_still_parse() -> None:
    old = {"type": "cancelled", "epoch": 2, "at": 5.0, "job_id": "j"}
    event = event_from_dict(old)
    assert isinstance(event, Cancelled)
    assert (event.worker_id, event.attempt, event.by, event.reason) == (None, None, None, "")
    assert event.to_dict() == old
    by_key = Cancelled(epoch=2, at=5.0, job_id="j", by="ops", reason="purge")
    assert by_key.to_dict() == {**old, "by": "ops", "reason": "purge"}
    assert event_from_dict(by_key.to_dict()) == by_key


def test_an_enqueued_without_a_time_limit_is_written_as_before() -> None:
    enqueued = next(e for e in SAMPLES if isinstance(e, Enqueued))
    plain = dataclasses.replace(enqueued, max_run_s=None, retry=None, expires_at=None)
    assert not {"max_run_s", "retry", "expires_at"} & set(plain.to_dict())
    assert event_from_dict(plain.to_dict()) == plain
    assert enqueued.to_dict()["max_run_s"] == 120.0
    with pytest.raises(ValueError, match=r"enqueued\.max_run_s"):
        event_from_dict({**enqueued.to_dict(), "max_run_s": 0})

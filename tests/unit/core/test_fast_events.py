"""The fast event factories build exactly what the constructors build."""

from __future__ import annotations

import dataclasses

import pytest

from dispatch.core import Assigned, Completed, Enqueued
from dispatch.core.fast_events import new_assigned, new_completed, new_enqueued
from tests.unit.core.samples import SAMPLES


def test_fast_factories_build_the_same_events_as_the_constructors() -> None:
    enqueued = next(e for e in SAMPLES if isinstance(e, Enqueued))
    assert (
        new_enqueued(
            enqueued.epoch,
            enqueued.at,
            enqueued.job_id,
            enqueued.client_id,
            enqueued.exec,
            enqueued.payload,
            enqueued.max_attempts,
            enqueued.timeout_s,
            enqueued.priority,
            enqueued.not_before,
            enqueued.seq,
            enqueued.retry,
            enqueued.expires_at,
            enqueued.max_run_s,
            enqueued.key,
        )
        == enqueued
    )
    assigned = next(e for e in SAMPLES if isinstance(e, Assigned))
    fast = new_assigned(3, 10.0, "j1", "w1", 1, "3.1", 40.0)
    assert fast == assigned and hash(fast) == hash(assigned)
    completed = next(e for e in SAMPLES if isinstance(e, Completed))
    assert new_completed(3, 60.0, "j1", "w2", 2, "3.2", [1, "a"]) == completed
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.attempt = 2  # type: ignore[misc]

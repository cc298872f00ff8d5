"""Epoch fencing: events of a deposed leader are void after a newer election."""

from __future__ import annotations

import pytest

from dispatch.core import (
    EpochFence,
    Event,
    LeaderElected,
    WorkerHeartbeat,
    WorkerJoined,
    fence_events,
)
from tests.unit.core.helpers import T0, make, request, worker


def beat(epoch: int) -> WorkerHeartbeat:
    return WorkerHeartbeat(epoch=epoch, at=1.0, worker_id=f"w{epoch}")


def test_election_raises_the_fence_and_voids_older_epochs() -> None:
    fence = EpochFence()
    assert fence.admit(beat(0))
    assert fence.admit(LeaderElected(epoch=2, at=1.0))
    assert fence.epoch == 2
    assert not fence.admit(beat(1)), "written by the deposed leader"
    assert fence.admit(beat(2)) and fence.admit(beat(3))


def test_events_before_the_election_in_the_log_are_valid() -> None:
    log: list[Event] = [beat(1), beat(1), LeaderElected(epoch=2, at=2.0), beat(1), beat(2)]
    kept, epoch = fence_events(log)
    assert kept == [log[0], log[1], log[2], log[4]] and epoch == 2


def test_an_older_election_is_itself_void() -> None:
    kept, epoch = fence_events(
        [LeaderElected(epoch=5, at=1.0), LeaderElected(epoch=3, at=2.0), beat(4), beat(5)]
    )
    assert [event.epoch for event in kept] == [5, 5] and epoch == 5


def test_the_fence_continues_across_batches() -> None:
    _, epoch = fence_events([LeaderElected(epoch=4, at=1.0)])
    kept, _ = fence_events([beat(3), beat(4)], epoch)
    assert [event.epoch for event in kept] == [4]
    assert list(EpochFence(4).filter([beat(3), beat(4)])) == [beat(4)]


def test_negative_epochs_are_refused() -> None:
    with pytest.raises(ValueError, match="epoch"):
        EpochFence(-1)


def test_replay_ignores_a_zombie_leader() -> None:
    leader = make()
    log = worker(leader, "w", credits=1) + leader.begin_epoch(1, T0)
    log += leader.submit(request("j1"), T0)
    zombie = WorkerJoined(epoch=0, at=T0 + 1, worker_id="zombie", subjects=("job.>",))
    replica = make()
    assert replica.apply_all([*log, zombie]) == len(log)
    assert replica.worker("zombie") is None and replica.epoch == 1

"""The leader's Kafka adapter against the real broker: the submit position rides in the events
log, a new reader starts from it, a rebuild finds it behind a snapshot's offsets, and a log
trimmed by retention past a snapshot is reported with the gap, never replayed from its head
(the leader then refuses to lead: see tests/unit/api/test_leader.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaProducer, TopicPartition

from dispatch.api.kafka_log import (
    EventLog,
    EventsReader,
    SnapshotBehindLog,
    SubmitReader,
    replay_events,
)
from dispatch.core.events import WorkerJoined
from dispatch.event_records import encode_batches
from dispatch.settings import Settings

pytestmark = pytest.mark.integration

GROUP = "g1"


@pytest.fixture
def event_log(topics: Settings) -> Iterator[EventLog]:
    log = EventLog(topics.kafka, GROUP, client_id="test-log")
    try:
        yield log
    finally:
        log.close()


def submit(settings: Settings, count: int) -> None:
    """`count` submissions, all to partition 0 of the submit topic's two."""
    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all")
    try:
        for n in range(count):
            value = json.dumps({"id": f"j{n}", "exec": "a.b"}).encode()
            producer.send(
                settings.kafka.submit_topic, key=f"j{n}".encode(), value=value, partition=0
            )
        producer.flush(30)
    finally:
        producer.close()


def batch(group: str, at: float, submit: dict[int, int] | None) -> list[bytes]:
    joined = WorkerJoined(epoch=1, at=at, worker_id=f"w{at}", subjects=("job.assign.>",))
    return encode_batches(group, 1, [joined], submit=submit)


def last_submit_position(
    settings: Settings, group: str, *, before: dict[int, int]
) -> dict[int, int] | None:
    with EventsReader(settings.kafka, client_id="test-look-back") as reader:
        return reader.last_submit_position(group, before=before)


def read_all(reader: SubmitReader, count: int) -> list[int]:
    offsets: list[int] = []
    for _ in range(100):
        offsets += [record.offset for record in reader.poll(timeout_ms=200)]
        if len(offsets) >= count:
            break
    return offsets


def test_a_new_reader_starts_at_the_position_the_log_carries_not_the_groups_offsets(
    topics: Settings, event_log: EventLog
) -> None:
    submit(topics, 10)
    first = SubmitReader(topics.kafka, GROUP, client_id="test-reader-1")
    try:
        assert read_all(first, 10) == list(range(10))
        assert first.take_moved() and not first.take_moved()
        assert first.position == {0: 10, 1: 0}
        # The group hears of offset 4 only; the log carries the whole position.
        event_log.commit(batch(GROUP, 1.0, {0: 4, 1: 0}), [], {0: 4, 1: 0})
        event_log.commit(batch(GROUP, 2.0, first.position), [])
    finally:
        first.close()
    (*_, last) = replay_events(topics.kafka, client_id="test-replay")
    assert last.submit == {0: 10, 1: 0}

    submit(topics, 2)
    carried = SubmitReader(topics.kafka, GROUP, client_id="test-reader-2", position=last.submit)
    group_only = SubmitReader(topics.kafka, GROUP, client_id="test-reader-3")
    try:
        assert read_all(carried, 2) == [10, 11]
        assert read_all(group_only, 8)[:2] == [4, 5]  # what the group's offsets alone give
        assert carried.position == {0: 12, 1: 0}
    finally:
        carried.close()
        group_only.close()


def test_the_last_position_before_a_snapshot_is_found_however_far_back_it_is(
    topics: Settings, event_log: EventLog
) -> None:
    event_log.commit(batch(GROUP, 1.0, {0: 3}), [])
    event_log.commit(batch(GROUP, 2.0, {0: 7}), [])
    # Another group's commits in the same topic, more than one backward window of them.
    for n in range(100):
        event_log.commit(batch("another", 10.0 + n, {0: 1000 + n}), [])
    end = {0: sum(1 for _ in replay_events(topics.kafka, client_id="count")) * 2}
    # Each transaction is a record and a commit marker: two offsets.
    assert last_submit_position(topics, GROUP, before=end) == {0: 7}
    assert last_submit_position(topics, GROUP, before={0: 2}) == {0: 3}
    assert last_submit_position(topics, GROUP, before={0: 0}) is None
    assert last_submit_position(topics, "nobody", before=end) is None
    # As a rebuild does it: an empty tail, then the look-back, on one reader.
    with EventsReader(topics.kafka, client_id="test-rebuild") as reader:
        assert list(reader.replay(end)) == []
        assert reader.last_submit_position(GROUP, before=end) == {0: 7}


def test_behind_records_that_carry_no_position_the_search_stops(
    topics: Settings, event_log: EventLog
) -> None:
    event_log.commit(batch(GROUP, 1.0, {0: 3}), [])
    # A log written before positions were carried: the group's offsets are the position
    # there, and reading it back to its start could take as long as a full replay.
    for n in range(100):
        event_log.commit(batch(GROUP, 10.0 + n, None), [])
    end = {0: 202}
    assert last_submit_position(topics, GROUP, before=end) is None


def test_a_log_trimmed_past_the_snapshot_is_reported_with_the_gap_and_never_replayed_partially(
    topics: Settings, event_log: EventLog
) -> None:
    for n in range(6):
        event_log.commit(batch(GROUP, float(n), {0: n}), [])
    # Retention removes the first three transactions (a record and a marker each).
    admin = KafkaAdminClient(bootstrap_servers=topics.kafka.bootstrap)
    try:
        admin.delete_records({TopicPartition(topics.kafka.events_topic, 0): 6})
    finally:
        admin.close()
    with pytest.raises(SnapshotBehindLog, match="starts at 6") as behind:
        list(replay_events(topics.kafka, client_id="behind", start={0: 2}))
    gap = behind.value
    assert (gap.topic, gap.partition, gap.snapshot_offset, gap.log_start) == (
        topics.kafka.events_topic, 0, 2, 6,
    )  # fmt: skip
    # A rebuild with no snapshot needs the log from offset 0: what retention left is partial.
    with (
        EventsReader(topics.kafka, client_id="complete") as reader,
        pytest.raises(SnapshotBehindLog, match="starts at 6, after the snapshot's offset 0"),
    ):
        list(reader.replay(None, complete=True))
    # Audits and tools may still read what is left.
    assert [b.submit for b in replay_events(topics.kafka, client_id="rest")] == [
        {0: 3},
        {0: 4},
        {0: 5},
    ]
    # The position before a snapshot is looked for only where the log still is.
    assert last_submit_position(topics, GROUP, before={0: 6}) is None
    assert last_submit_position(topics, GROUP, before={0: 8}) == {0: 3}

"""The seams' contract (`dispatch.api.leader_io.NodeIO`), held by Kafka and by its in-memory twin
alike: what the leader relies on, tested against both, so that the API tests run on the twin test
what runs on the broker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from dispatch.api.leader_io import KafkaLeaderIO, NodeIO
from dispatch.api.memory_log import MemoryLog
from dispatch.core.commands import SubmitRequest
from dispatch.event_records import decode_batch, encode_batches
from dispatch.settings import Settings

pytestmark = pytest.mark.integration

GROUP = "contract"


@pytest.fixture(params=["memory", "librdkafka", "kafka-python"])
def io(request: pytest.FixtureRequest, settings: Settings) -> Iterator[NodeIO]:
    """The in-memory twin, and Kafka with the leader's log on each client it can use."""
    if request.param == "memory":
        yield MemoryLog(settings)
    else:
        topics: Settings = request.getfixturevalue("topics")
        kafka = topics.kafka.model_copy(update={"leader_client": request.param})
        yield KafkaLeaderIO(topics.model_copy(update={"kafka": kafka}))


def record(epoch: int, position: dict[int, int] | None) -> bytes:
    [raw] = encode_batches(GROUP, epoch, [], submit=position)
    return raw


def test_a_commit_is_read_back_whole_and_in_order(io: NodeIO) -> None:
    log = io.open_log(GROUP, "contract-writer")
    try:
        log.commit([record(1, {0: 1}), record(1, {0: 2})], [])
        log.commit([record(1, {0: 5})], [])
    finally:
        log.close()
    reader = io.open_log_reader("contract-reader")
    try:
        replayed = list(reader.replay(None, complete=True))
        assert [batch.submit for batch in replayed] == [{0: 1}, {0: 2}, {0: 5}]
        assert reader.last_submit_position(GROUP, before={0: 2}) == {0: 2}
        assert reader.last_submit_position("another-group", before={0: 3}) is None
    finally:
        reader.close()


def test_opening_the_log_again_fences_the_writer_before(io: NodeIO) -> None:
    deposed = io.open_log(GROUP, "contract-old")
    deposed.commit([record(1, None)], [])
    successor = io.open_log(GROUP, "contract-new")
    try:
        with pytest.raises(Exception):  # noqa: B017  (Kafka's and the twin's differ)
            deposed.commit([record(1, {0: 9})], [])
        successor.commit([record(2, None)], [])
    finally:
        deposed.close()
        successor.close()
    reader = io.open_log_reader("contract-reader")
    try:
        epochs = [batch.epoch for batch in reader.replay(None, complete=True)]
    finally:
        reader.close()
    assert epochs == [1, 2], "the fenced writer's commit must not be in the log"


def test_submissions_sent_are_read_once_from_the_position(io: NodeIO) -> None:
    jobs = [SubmitRequest(id=f"c{n}", exec="contract.x", payload={}) for n in range(5)]
    sink = io.open_submit_sink("contract-sink")
    try:
        asyncio.run(sink.send(jobs))
    finally:
        sink.close(5.0)
    source = io.open_submit_source(GROUP, "contract-source", None)
    try:
        read: list[bytes] = []
        for _ in range(50):
            read += [r.key for r in source.poll(200) if r.key is not None]
            if len(read) >= len(jobs):
                break
        assert sorted(read) == sorted(job.id.encode() for job in jobs)
        assert source.take_moved() and not source.take_moved()
        assert sum(source.position.values()) == len(jobs)
        assert source.poll(100) == [] and source.broker_answers()
    finally:
        source.close()
    # A later term starts from the position the log carried: nothing is read twice.
    again = io.open_submit_source(GROUP, "contract-again", source.position)
    try:
        assert again.poll(300) == []
    finally:
        again.close()


def test_a_wake_ends_a_polls_wait_at_once_and_a_submission_ends_it_too(io: NodeIO) -> None:
    """What lets an idle leader sleep: its commands end the wait (`wake`), and so does a
    submission, each long before the wait would have ended by itself."""
    source = io.open_submit_source(GROUP, "contract-wake", None)
    sink = io.open_submit_sink("contract-wake-sink")
    try:
        threading.Timer(0.2, source.wake).start()
        started = time.monotonic()
        assert source.poll(10_000) == []
        assert time.monotonic() - started < 5.0
        job = SubmitRequest(id="woken", exec="contract.x", payload={})
        threading.Timer(0.2, lambda: asyncio.run(sink.send([job]))).start()
        started = time.monotonic()
        read = source.poll(10_000)
        assert time.monotonic() - started < 5.0
        assert [r.key for r in read] == [b"woken"]
    finally:
        sink.close(5.0)
        source.close()


def test_a_decoded_commit_is_what_the_leader_encoded(io: NodeIO) -> None:
    log = io.open_log(GROUP, "contract-writer")
    try:
        log.commit([record(3, {1: 4})], [b"a rejection"])
    finally:
        log.close()
    reader = io.open_log_reader("contract-reader")
    try:
        [batch] = list(reader.replay(None, complete=True))
    finally:
        reader.close()
    assert batch == decode_batch(record(3, {1: 4}))


def test_the_group_offsets_a_commit_carries_are_where_a_source_without_a_position_starts(
    io: NodeIO,
) -> None:
    """The offsets that ride in a transaction now and then (for the tools that read the
    consumer group, and a term whose log carries no position) are the group's own."""
    jobs = [SubmitRequest(id=f"o{n}", exec="contract.x", payload={}) for n in range(4)]
    sink = io.open_submit_sink("contract-offsets-sink")
    try:
        asyncio.run(sink.send(jobs))
    finally:
        sink.close(5.0)
    source = io.open_submit_source(GROUP, "contract-offsets", None)
    try:
        read = 0
        for _ in range(50):
            read += len(source.poll(200))
            if read >= len(jobs):
                break
        position = dict(source.position)
    finally:
        source.close()
    log = io.open_log(GROUP, "contract-offsets-writer")
    try:
        log.commit([record(1, position)], [], position)
    finally:
        log.close()
    again = io.open_submit_source(GROUP, "contract-offsets-again", None)
    try:
        assert again.poll(500) == []
        assert again.position == position
    finally:
        again.close()

"""The node's librdkafka producer on `dispatch.submit`, against the session's real broker:
what `send` returned for is in the topic, and an unreachable Kafka is a `SubmitUnavailable`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from kafka import KafkaConsumer, TopicPartition

from dispatch.api.submit_producer import SubmitProducer, SubmitUnavailable
from dispatch.core.commands import SubmitRequest
from dispatch.settings import KafkaSettings, Settings
from dispatch.stack.ports import free_port
from dispatch.submit_records import submit_record_value

pytestmark = pytest.mark.integration


@pytest.fixture
def producer(topics: Settings) -> Iterator[SubmitProducer]:
    submit = SubmitProducer(topics.kafka, "test-submit")
    try:
        yield submit
    finally:
        submit.close(10)


def _submission(n: int) -> SubmitRequest:
    return SubmitRequest(id=f"job-{n}", exec="a.b", payload={"n": n}, client_id="dev")


def _records(kafka: KafkaSettings) -> list[tuple[bytes, bytes]]:
    """Every (key, value) in the submit topic, read up to the end offsets of now."""
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
    try:
        partitions = [
            TopicPartition(kafka.submit_topic, partition)
            for partition in sorted(consumer.partitions_for_topic(kafka.submit_topic) or ())
        ]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        records: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + 20
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, f"read {len(records)} records in 20 s"
            for batch in consumer.poll(timeout_ms=500).values():
                records += [(record.key, record.value) for record in batch]
        return records
    finally:
        consumer.close()


def test_a_sent_record_is_in_the_submit_topic_once_send_returns(
    producer: SubmitProducer, topics: Settings
) -> None:
    submission = SubmitRequest(id="one", exec="image.resize", payload={"w": 10}, client_id="dev")
    asyncio.run(producer.send([submission]))
    assert _records(topics.kafka) == [(b"one", submit_record_value(submission))]


def test_every_record_of_a_batch_is_in_the_topic_once(
    producer: SubmitProducer, topics: Settings
) -> None:
    submissions = [_submission(n) for n in range(300)]
    asyncio.run(producer.send(submissions))
    records = _records(topics.kafka)
    assert len(records) == 300
    assert sorted(records) == sorted(
        (submission.id.encode(), submit_record_value(submission)) for submission in submissions
    )


def test_concurrent_sends_each_return_once_their_own_records_are_in(
    producer: SubmitProducer, topics: Settings
) -> None:
    async def send_all() -> None:
        await asyncio.gather(
            *(producer.send([_submission(n), _submission(n + 1000)]) for n in range(50))
        )

    asyncio.run(send_all())
    keys = sorted(key for key, _value in _records(topics.kafka))
    assert keys == sorted(f"job-{n}".encode() for n in [*range(50), *range(1000, 1050)])


def test_sending_nothing_returns_at_once(producer: SubmitProducer, topics: Settings) -> None:
    started = time.monotonic()
    asyncio.run(producer.send([]))
    assert time.monotonic() - started < 0.5
    assert _records(topics.kafka) == []


@pytest.mark.timeout(30)
def test_a_send_to_an_unreachable_kafka_raises_submit_unavailable(settings: Settings) -> None:
    closed = settings.kafka.model_copy(update={"bootstrap": f"127.0.0.1:{free_port()}"})
    producer = SubmitProducer(closed, "test-unreachable", delivery_timeout_ms=1000)
    try:
        started = time.monotonic()
        with pytest.raises(SubmitUnavailable, match="Kafka did not take it"):
            asyncio.run(producer.send([_submission(1), _submission(2)]))
        assert time.monotonic() - started < 10
    finally:
        started = time.monotonic()
        producer.close(5)
        assert time.monotonic() - started < 6


def test_close_after_sends_returns_promptly_and_stops_the_report_thread(topics: Settings) -> None:
    producer = SubmitProducer(topics.kafka, "test-close")
    asyncio.run(producer.send([_submission(n) for n in range(20)]))
    asyncio.run(producer.send([_submission(20)]))
    started = time.monotonic()
    producer.close(10)
    assert time.monotonic() - started < 2
    assert not producer._poller.is_alive()
    assert len(_records(topics.kafka)) == 21

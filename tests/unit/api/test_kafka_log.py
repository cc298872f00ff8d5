"""A commit counts only when the whole transaction is in the log (`check_durable`)."""

from __future__ import annotations

import pytest
from kafka.errors import KafkaError, OutOfOrderSequenceNumberError
from kafka.future import Future
from kafka.producer.transaction_manager import ProducerIdAndEpoch

from dispatch.api.kafka_log import check_durable


def landed() -> Future:
    future = Future()
    future.success("metadata")
    return future


def test_a_transaction_whose_records_all_landed_under_one_epoch_is_durable() -> None:
    identity = ProducerIdAndEpoch(7, 3)
    check_durable([landed(), landed()], began_as=identity, ended_as=ProducerIdAndEpoch(7, 3))


def test_an_epoch_bump_during_the_transaction_means_it_was_aborted() -> None:
    # kafka-python bumps the epoch after InvalidProducerEpoch, aborting the open transaction,
    # and then lets the commit of an empty transaction succeed.
    with pytest.raises(KafkaError, match="aborted"):
        check_durable(
            [landed()], began_as=ProducerIdAndEpoch(7, 3), ended_as=ProducerIdAndEpoch(7, 4)
        )


def test_a_record_whose_send_failed_is_not_durable() -> None:
    failed = Future()
    failed.failure(OutOfOrderSequenceNumberError())
    identity = ProducerIdAndEpoch(7, 3)
    with pytest.raises(KafkaError, match="not written"):
        check_durable([landed(), failed], began_as=identity, ended_as=identity)

"""The lag: Kafka end offsets (read_committed) minus what the last batch recorded in jobs."""

from __future__ import annotations

import time

import pytest

from dispatch.delta.lag import LagProbe, last_batch_age_s
from dispatch.warehouse import Warehouse
from tests.integration.streaming.conftest import MixedRun

pytestmark = pytest.mark.integration


def test_lag_counts_what_the_tables_have_not_absorbed(mixed_run: MixedRun) -> None:
    kafka = mixed_run.settings.kafka
    before, between, after = mixed_run.lag_before, mixed_run.lag_between, mixed_run.lag_after
    workload = mixed_run.workload
    assert before[kafka.submit_topic] == len(workload.submits)
    assert before[kafka.rejected_topic] == len(workload.rejections)
    assert before[kafka.events_topic] == len(workload.log) // 2
    # The second part (transactions, one aborted) is all in the events topic.
    assert between[kafka.submit_topic] == 0 and between[kafka.rejected_topic] == 0
    assert between[kafka.events_topic] > len(workload.log) - len(workload.log) // 2
    assert after == dict.fromkeys(after, 0) and set(after) == set(before)


def test_the_probe_measures_repeatedly_and_the_last_batch_is_recent(
    mixed_run: MixedRun,
) -> None:
    with LagProbe(mixed_run.settings) as probe:
        assert probe.measure() == mixed_run.lag_after
        assert probe.partition_lag()[mixed_run.settings.kafka.submit_topic] == {0: 0, 1: 0}
    now = time.time()
    age = last_batch_age_s(Warehouse.of(mixed_run.settings), now)
    # The last batch committed during the fixture's second run, however long ago the
    # fixture ran (other modules share it); a second either side for the commit's timestamp.
    started, ended = mixed_run.last_batch_window
    assert age is not None and now - ended - 1.0 <= age <= now - started + 1.0

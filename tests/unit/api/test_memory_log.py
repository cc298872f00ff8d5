"""The in-memory log's own behaviours beyond the shared contract
(tests/integration/api/test_leader_io.py): a log that is down, retention, raw records."""

from __future__ import annotations

import asyncio

import pytest

from dispatch.api.kafka_log import SnapshotBehindLog, submit_group_id
from dispatch.api.memory_log import LogUnavailable, MemoryLog, WriterFenced
from dispatch.api.submit_producer import SubmitUnavailable
from dispatch.core.commands import SubmitRequest
from dispatch.event_records import encode_batches
from dispatch.settings import load_settings


def memory() -> MemoryLog:
    return MemoryLog(load_settings())


def batch(position: int) -> bytes:
    [raw] = encode_batches("g", 1, [], submit={0: position})
    return raw


def test_a_log_that_is_down_takes_no_commit_and_no_submission_and_answers_no_probe() -> None:
    log = memory()
    writer = log.open_log("g", "w")
    source = log.open_submit_source("g", "r", None)
    log.down = True
    with pytest.raises(LogUnavailable):
        writer.commit([batch(1)], [b"rejected"], {0: 1})
    with pytest.raises(SubmitUnavailable):
        asyncio.run(log.open_submit_sink("s").send([SubmitRequest(id="j", exec="a", payload={})]))
    assert not source.broker_answers()
    assert (log.events, log.rejected, log.group_offsets) == ([], [], {})
    log.down = False
    writer.commit([batch(1)], [b"rejected"], {0: 1})
    assert len(log.events) == 1 and log.rejected == [b"rejected"]
    assert log.group_offsets == {submit_group_id("g"): {0: 1}}


def test_a_fenced_writer_changes_nothing() -> None:
    log = memory()
    old = log.open_log("g", "old")
    log.open_log("g", "new")
    with pytest.raises(WriterFenced):
        old.commit([batch(1)], [b"rejected"])
    assert log.events == [] and log.rejected == [] and log.commits == 0
    log.open_log("other-group", "w").commit([batch(2)], [])  # groups fence only themselves
    assert log.commits == 1


def test_retention_makes_a_replay_from_before_the_start_a_named_gap() -> None:
    log = memory()
    writer = log.open_log("g", "w")
    for position in range(5):
        writer.commit([batch(position)], [])
    log.trim_events(3)
    reader = log.open_log_reader("r")
    with pytest.raises(SnapshotBehindLog) as gap:
        list(reader.replay({0: 1}))
    assert (gap.value.snapshot_offset, gap.value.log_start) == (1, 3)
    with pytest.raises(SnapshotBehindLog):
        list(reader.replay(None, complete=True))  # a rebuild needs all of it
    assert [b.submit for b in reader.replay(None)] == [{0: 3}, {0: 4}]
    assert [b.submit for b in reader.replay({0: 4})] == [{0: 4}]


def test_a_record_no_leader_wrote_is_skipped_on_replay() -> None:
    log = memory()
    log.open_log("g", "w").commit([b"not a batch", batch(7)], [])
    assert [b.submit for b in log.open_log_reader("r").replay(None)] == [{0: 7}]


def test_raw_submissions_keep_per_key_order_and_a_source_starts_at_the_groups_offsets() -> None:
    log = memory()
    for value in (b"1", b"2", b"3"):
        log.append_submission(b"same-key", value)
    [partition] = {r.partition for r in log.open_submit_source("g", "r", None).poll(0)}
    assert [r.value for r in log.submit[partition]] == [b"1", b"2", b"3"]
    log.open_log("g", "w").commit([], [], {partition: 2})
    resumed = log.open_submit_source("g", "r2", None)
    assert [r.value for r in resumed.poll(0)] == [b"3"]

"""Golden `dispatch.events` logs replayed as a new leader and the streaming fold replay them.

As Temporal's `tests/worker/test_replayer.py` replays golden histories: `tests/golden/` holds
logs real leaders wrote (today's record format, and the legacy one from before records carried
the `submit` position) and the state each must rebuild to. A change to the record format, the
decoder, the epoch fence or the core's reducer that would make an existing production log
rebuild differently fails here. The golden files are fixed inputs: they are not remade from
the code at test time (see `tests/golden/make_golden.py` for how they were made).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.dispatcher import Dispatcher
from dispatch.core.errors import InvalidTransition
from dispatch.delta.job_rows import job_row, job_state
from dispatch.event_records import decode_batch
from dispatch.streaming.decode import KafkaRow, decode_events, screen_events
from dispatch.streaming.fold import fence_batch, fold_batch

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
GROUP = "default"
TOPIC = "dispatch.events"
LOGS = ["current", "legacy"]

REGENERATE = (
    "The golden log {name!r} no longer replays to its recorded state: the change makes logs "
    "already in production rebuild differently (a new leader, or the Delta fold, would hold "
    "other jobs than the leader that wrote them). If, and only if, that is intended and "
    "existing logs are handled, remake the file deliberately with "
    "`.venv/bin/python -m tests.golden.make_golden {name}` and say so in the commit."
)


@dataclass(frozen=True)
class GoldenRecord:
    partition: int
    offset: int
    key: bytes
    value: bytes


def load_log(name: str) -> list[GoldenRecord]:
    records = []
    for line in (GOLDEN / f"{name}.events.jsonl").read_text("utf-8").splitlines():
        item = json.loads(line)
        records.append(
            GoldenRecord(
                item["partition"],
                item["offset"],
                item["key"].encode("utf-8"),
                item["value"].encode("utf-8"),
            )
        )
    return records


def load_expected(name: str) -> dict[str, Any]:
    expected: dict[str, Any] = json.loads((GOLDEN / f"{name}.expected.json").read_text("utf-8"))
    return expected


@dataclass
class Rebuilt:
    """What a new leader holds after replaying a log from its start."""

    jobs: dict[str, dict[str, Any]]
    epoch: int
    submit_position: dict[str, int] | None
    events: int
    admitted: int
    skipped: list[str]

    def summary(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "submit_position": self.submit_position,
            "events": self.events,
            "admitted": self.admitted,
        }


def replay(values: list[bytes], group: str = GROUP) -> Rebuilt:
    """The rebuild of `dispatch.api.leader.Leader._rebuild` without a snapshot (`_replay`): every
    record in log order, the group's only; each event through `apply` (the epoch fence voids a
    deposed leader's); an event the core refuses is skipped (the leader logs it); the submit
    position is the last one carried by a batch of an epoch the fence still admits."""
    core = Dispatcher.restore([])
    position: dict[int, int] | None = None
    events = admitted = 0
    skipped: list[str] = []
    for raw in values:
        batch = decode_batch(raw)
        if batch.group != group:
            continue
        for event in batch.events:
            events += 1
            try:
                admitted += core.apply(event)
            except InvalidTransition as error:
                skipped.append(f"{event!r}: {error}")
        if batch.submit is not None and batch.epoch >= core.fence.epoch:
            position = batch.submit
    return Rebuilt(
        jobs={job.id: job.to_dict() for job in core.jobs()},
        epoch=core.fence.epoch,
        submit_position=None if position is None else {str(p): o for p, o in position.items()},
        events=events,
        admitted=admitted,
        skipped=skipped,
    )


def fold(records: list[GoldenRecord]) -> tuple[dict[str, dict[str, Any]], int]:
    """The streaming fold of the whole log as one micro-batch (every job is touched, so no
    `jobs` rows are needed): jobs as their `jobs` rows read back, and the fence epoch."""
    stamp = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [KafkaRow(TOPIC, r.partition, r.offset, r.key, r.value, stamp) for r in records]
    logged, undecodable = decode_events(rows)
    assert undecodable == []
    logged, unfit = screen_events(logged)
    assert unfit == []
    admitted, epochs = fence_batch(logged, {})
    result = fold_batch(logged, admitted, {})
    assert result.refused == [], result.refused
    jobs = {}
    for (group, job_id), state in result.final.items():
        if state is not None and group == GROUP:
            jobs[job_id] = job_state(job_row(group, state))[1].record.to_dict()
    return jobs, epochs.get(GROUP, 0)


def _job_diff(got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]]) -> str:
    lines = [f"missing: {sorted(set(want) - set(got))}", f"extra: {sorted(set(got) - set(want))}"]
    for job_id in sorted(set(got) & set(want)):
        fields = {k for k in got[job_id].keys() | want[job_id].keys()}
        for name in sorted(fields):
            if got[job_id].get(name) != want[job_id].get(name):
                lines.append(
                    f"{job_id}.{name}: got {got[job_id].get(name)!r}, "
                    f"expected {want[job_id].get(name)!r}"
                )
    return "\n".join(lines[:40])


def check_replay(name: str, records: list[GoldenRecord]) -> None:
    """AssertionError (saying how to remake the file, deliberately) unless the log rebuilds
    to its recorded state."""
    expected = load_expected(name)
    rebuilt = replay([record.value for record in records], expected["group"])
    message = REGENERATE.format(name=name)
    assert rebuilt.skipped == [], f"{message}\nevents the core now refuses: {rebuilt.skipped}"
    want = {key: expected[key] for key in rebuilt.summary()}
    assert rebuilt.summary() == want, f"{message}\n{rebuilt.summary()} != {want}"
    assert rebuilt.jobs == expected["jobs"], (
        f"{message}\n{_job_diff(rebuilt.jobs, expected['jobs'])}"
    )


@pytest.mark.parametrize("name", LOGS)
def test_a_golden_log_rebuilds_the_leaders_state(name: str) -> None:
    check_replay(name, load_log(name))


@pytest.mark.parametrize("name", LOGS)
def test_the_streaming_fold_of_a_golden_log_gives_the_same_jobs(name: str) -> None:
    expected = load_expected(name)
    jobs, epoch = fold(load_log(name))
    message = REGENERATE.format(name=name)
    assert epoch == expected["epoch"], message
    assert jobs == expected["jobs"], f"{message}\n{_job_diff(jobs, expected['jobs'])}"


@pytest.mark.parametrize("name", LOGS)
def test_a_golden_log_covers_what_a_production_log_holds(name: str) -> None:
    """The golden logs stay worth replaying: every kind of event, a failover with a deposed
    leader's writes after it (voided by the fence), several records of one epoch in a row."""
    records = load_log(name)
    batches = [decode_batch(record.value) for record in records]
    kinds = Counter(event.type for batch in batches for event in batch.events)
    required = {
        "leader_elected", "pruned", "worker_joined", "credit_granted", "worker_heartbeat",
        "worker_lost", "enqueued", "assigned", "reassigned", "job_heartbeat", "completed",
        "requeued", "dead_lettered", "cancelled", "redriven",
    }  # fmt: skip
    if name == "current":
        # Today's core requeues a timed-out job rather than reassign it to its own busy
        # worker, so the workload no longer makes `reassigned`; the legacy log holds them.
        required.remove("reassigned")
    assert set(kinds) >= required, kinds
    assert kinds["leader_elected"] >= 2
    expected = load_expected(name)
    assert expected["records"] == len(records)
    assert expected["admitted"] < expected["events"], "no deposed leader's event to fence"
    assert [record.offset for record in records] == list(range(len(records)))
    positions = [batch.submit for batch in batches]
    if name == "legacy":
        assert b'"submit"' not in b"".join(record.value for record in records)
        assert positions == [None] * len(records)
        assert expected["submit_position"] is None
    else:
        assert all(position is not None for position in positions[-3:])
        # A commit split over records: only its last one carries the position.
        assert None in positions


def _mutated(name: str, records: list[GoldenRecord], change: str) -> list[GoldenRecord]:
    """A copy of the log with one record's value changed the way `change` says."""
    out = list(records)
    jobs = load_expected(name)["jobs"]
    newest = max(decode_batch(record.value).epoch for record in records)
    for index in reversed(range(len(records))):
        record = records[index]
        document = json.loads(record.value)
        if change == "result":
            # An ack of the newest epoch, of a job still held at the end (not pruned).
            completed = [
                e for e in document["events"] if e["type"] == "completed" and e["job_id"] in jobs
            ]
            if not completed or document["epoch"] != newest:
                continue
            completed[-1]["result"] = {"tampered": True}
        elif change == "submit":
            if "submit" not in document:
                continue
            document["submit"] = {"0": document["submit"]["0"] + 1}
        value = json.dumps(document, separators=(",", ":")).encode()
        out[index] = GoldenRecord(record.partition, record.offset, record.key, value)
        return out
    raise AssertionError(f"no record to change for {change!r}")


@pytest.mark.parametrize(("name", "change"), [("current", "result"), ("current", "submit"),
                                              ("legacy", "result")])  # fmt: skip
def test_a_changed_record_fails_the_replay(name: str, change: str) -> None:
    """The check is not vacuous: one changed value in one record of a golden log (an ack's
    result; the submit position a new leader resumes from) rebuilds another state, and the
    failure says how to remake the file."""
    records = load_log(name)
    check_replay(name, records)
    with pytest.raises(AssertionError, match=r"make_golden"):
        check_replay(name, _mutated(name, records, change))

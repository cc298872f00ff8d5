"""Property-based fuzzing of the `dispatch.submit` record format: whatever any producer writes,
each record either becomes a job (an `enqueued` event in the log) or lands in
`dispatch.submit.rejected` with a reason; the leader keeps its term (same epoch, /readyz 200),
writes no traceback, and a canary job still completes.

Records: arbitrary bytes, JSON objects with wrong types, huge integers, NaN/Infinity literals,
deep nesting, ids with `/` and `..`, keys that differ from the id.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import hypothesis
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from dispatch.core.events import Enqueued
from dispatch.event_records import decode_batch
from dispatch.submit_records import Rejection
from tests.integration.hostile.conftest import HostileStack

pytestmark = pytest.mark.integration

EXAMPLES = 600
RESOLVE_TIMEOUT_S = 90.0
INT32_MAX = 2**31 - 1
"""The Delta `jobs` table stores attempts, max_attempts and priority as int32."""


@dataclass(frozen=True)
class Sent:
    label: str
    key: bytes | None
    value: bytes
    partition: int
    offset: int


huge_ints = st.sampled_from([2**31, 2**31 - 1, 2**53 + 1, 2**63, 2**64, 10**30, -(2**63), -1, 0])
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), huge_ints,
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
)  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
odd_ids = st.one_of(
    st.text(min_size=1, max_size=40),
    st.sampled_from(
        [
            "a/b",
            "../etc/passwd",
            "..",
            ".",
            "x/../y",
            "%2e%2e",
            "a%2Fb",
            "é",
            "a b",
            "a\nb",
            "a\r\nb",
            "\u0000",
            "🙂",
            "?x=1",
            "#f",
        ]
    ),
    st.sampled_from([129, 1_000, 100_000]).map(lambda n: "i" * n),
)
execs = st.one_of(
    st.just("hostile.kafka"),
    st.text(max_size=20),
    st.sampled_from(["a..b", ".a", "a.", "a b", ">"]),
)
objects = st.fixed_dictionaries(
    {"id": st.one_of(odd_ids, json_values), "exec": st.one_of(execs, json_values),
     "payload": json_values},
    optional={name: st.one_of(huge_ints, json_values) for name in (
        "max_attempts", "timeout_s", "priority", "delay_s", "client_id")},
)  # fmt: skip


def _deep_payload(depth: int) -> bytes:
    return b'{"id":"deep-%d","exec":"hostile.kafka","payload":%s%s}' % (
        depth, b"[" * depth, b"]" * depth,
    )  # fmt: skip


nan_records = st.tuples(
    st.sampled_from(["NaN", "Infinity", "-Infinity"]),
    st.sampled_from(["payload", "timeout_s", "priority", "max_attempts", "delay_s"]),
    st.integers(min_value=0, max_value=10**6),
).map(
    lambda t: ("nan literal", f'{{"id": "nan-{t[2]}", "exec": "hostile.kafka", "payload": 1, '
               f'"{t[1]}": {t[0]}}}'.replace('"payload": 1, "payload"', '"payload"').encode())
)  # fmt: skip
records = st.one_of(
    st.binary(max_size=300).map(lambda raw: ("bytes", raw)),
    objects.map(lambda document: ("object", json.dumps(document).encode())),
    st.fixed_dictionaries(
        {
            "id": st.from_regex(r"\Avalid-[A-Za-z0-9_-]{1,30}\Z"),
            "exec": st.just("hostile.kafka"),
            "payload": json_values,
        },
        optional={"max_attempts": st.integers(1, 10), "priority": st.integers(-100, 100)},
    ).map(lambda document: ("plausible job", json.dumps(document).encode())),
    nan_records,
    st.integers(min_value=10, max_value=60_000).map(lambda d: ("deep nesting", _deep_payload(d))),
    st.fixed_dictionaries(
        {"id": odd_ids, "exec": st.just("hostile.kafka"), "payload": json_values}
    ).map(lambda document: ("odd id", json.dumps(document).encode())),
)
key_choices = st.sampled_from(["id", "none", "other"])


def _key_for(value: bytes, choice: str) -> bytes | None:
    if choice == "none":
        return None
    if choice == "other":
        return b"not-the-id"
    identifier = _candidate_id(value)
    return identifier.encode("utf-8", "surrogatepass") if identifier is not None else None


_LEADING_ID = re.compile(rb'^\{"id":"([^"\\]+)"')


def _candidate_id(value: bytes) -> str | None:
    """The string `id` of a record's JSON object, if it has one."""
    try:
        document = json.loads(value)
    except RecursionError:  # too deep for this test's own parser: the id leads the record
        found = _LEADING_ID.match(value)
        return found.group(1).decode() if found else None
    except ValueError:
        return None
    identifier = document.get("id") if isinstance(document, dict) else None
    return identifier if isinstance(identifier, str) else None


def _read(stack: HostileStack, topic: str) -> list[Any]:
    consumer = KafkaConsumer(
        bootstrap_servers=stack.settings.kafka.bootstrap, group_id=None,
        enable_auto_commit=False, isolation_level="read_committed",
        auto_offset_reset="earliest", client_id="hostile-audit",
    )  # fmt: skip
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        found: list[Any] = []
        deadline = time.monotonic() + 60
        while any(consumer.position(p) < end[p] for p in partitions):
            assert time.monotonic() < deadline, f"{topic}: not read to its end in 60 s"
            for batch in consumer.poll(timeout_ms=500).values():
                found += batch
        return found
    finally:
        consumer.close()


def _outcomes(
    stack: HostileStack, sent: list[Sent]
) -> tuple[dict[tuple[int, int], str], dict[str, Enqueued]]:
    """(partition, offset) of each rejected submit record -> its reason; enqueued id -> event."""
    rejected = {}
    for record in _read(stack, stack.settings.kafka.rejected_topic):
        rejection = Rejection.from_record_value(record.value)
        rejected[(rejection.partition, rejection.offset)] = rejection.reason
    enqueued: dict[str, Enqueued] = {}
    for record in _read(stack, stack.settings.kafka.events_topic):
        try:
            events = decode_batch(record.value).events
        except RecursionError:
            # A new leader's rebuild would fail on this record too.
            UNDECODABLE_EVENTS.add(record.offset)
            continue
        for event in events:
            if isinstance(event, Enqueued):
                enqueued[event.job_id] = event
    return rejected, enqueued


UNDECODABLE_EVENTS: set[int] = set()
"""Offsets of `dispatch.events` records too deeply nested to decode."""


@pytest.mark.timeout(600)
def test_every_hostile_submit_record_is_a_job_or_a_rejection(hostile_stack: HostileStack) -> None:
    stack = hostile_stack
    epoch = stack.epoch()
    producer = KafkaProducer(
        bootstrap_servers=stack.settings.kafka.bootstrap, acks="all",
        max_request_size=4 * 1024 * 1024, client_id="hostile-producer",
    )  # fmt: skip
    sent: list[Sent] = []

    @hypothesis.settings(
        max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )  # fmt: skip
    @given(record=records, key_choice=key_choices)
    def produce(record: tuple[str, bytes], key_choice: str) -> None:
        label, value = record
        key = _key_for(value, key_choice)
        metadata = producer.send(stack.settings.kafka.submit_topic, key=key, value=value).get(30)
        sent.append(Sent(label, key, value, metadata.partition, metadata.offset))

    try:
        produce()
        producer.flush(30)
    finally:
        producer.close(10)

    deadline = time.monotonic() + RESOLVE_TIMEOUT_S
    while True:
        rejected, enqueued = _outcomes(stack, sent)
        unresolved = [
            s for s in sent
            if (s.partition, s.offset) not in rejected and _candidate_id(s.value) not in enqueued
        ]  # fmt: skip
        if not unresolved or time.monotonic() > deadline:
            break
        time.sleep(3.0)

    findings: dict[str, Any] = {"records": len(sent)}
    findings["rejected"] = sum(1 for s in sent if (s.partition, s.offset) in rejected)
    findings["accepted"] = len(sent) - findings["rejected"] - len(unresolved)
    findings["neither_job_nor_rejection"] = [
        f"{s.label}: key={s.key!r} value={s.value[:150]!r}" for s in unresolved[:20]
    ]
    findings["rejections_without_reason"] = [
        f"{p}/{o}" for (p, o), reason in rejected.items() if not reason.strip()
    ][:20]
    ours = {_candidate_id(s.value) for s in sent} - {None}
    accepted = [event for job_id, event in enqueued.items() if job_id in ours]
    findings["accepted_out_of_int32"] = [
        f"{event.job_id[:60]}: max_attempts={event.max_attempts} priority={event.priority}"
        for event in accepted
        if not (-INT32_MAX - 1 <= event.priority <= INT32_MAX and event.max_attempts <= INT32_MAX)
    ][:20]
    findings["accepted_ids_with_slash_or_dotdot"] = [
        event.job_id[:80] for event in accepted if "/" in event.job_id or ".." in event.job_id
    ][:20]
    unreachable = []
    with stack.client("admin") as admin:
        for job_id in findings["accepted_ids_with_slash_or_dotdot"]:
            answer = admin.get(f"/v1/jobs/{quote(job_id, safe='')}")
            if answer.status_code != 200:
                unreachable.append(f"{job_id!r}: GET answered {answer.status_code}")
    findings["accepted_but_unreachable"] = unreachable
    findings["labels"] = dict(Counter(s.label for s in sent))
    findings["rejection_reasons"] = dict(
        Counter(re.sub(r"\d+", "N", reason)[:70] for reason in rejected.values()).most_common(25)
    )
    findings["undecodable_events_records"] = sorted(UNDECODABLE_EVENTS)[:20]
    findings["tracebacks"] = stack.tracebacks()[:40]
    ready_epoch = stack.epoch()
    findings["epoch_before_after"] = [epoch, ready_epoch]
    (stack.folder / "kafka-fuzz-findings.json").write_text(json.dumps(findings, indent=1))
    print(json.dumps(findings, indent=1)[:8000])

    assert len(sent) >= 500
    assert ready_epoch == epoch, "the leader's term ended during the fuzzing"
    stack.round_trip()
    assert not findings["tracebacks"], findings["tracebacks"]
    assert not findings["neither_job_nor_rejection"], findings
    assert not findings["rejections_without_reason"], findings
    assert not findings["accepted_out_of_int32"], findings
    assert not findings["accepted_but_unreachable"], findings
    assert not findings["undecodable_events_records"], findings

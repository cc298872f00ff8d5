"""Hypothesis strategies for hostile `dispatch.events` records: what a producer writing straight
to the topic could put there. Arbitrary bytes, tombstones, JSON nested past any parser, and
records shaped like the leader's whose events carry wrong types, integers past every column,
NaN and infinities, lone surrogates, deep payloads, missing and unknown fields."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import strategies as st

from dispatch.event_records import FORMAT_VERSION

HOSTILE_INTS: list[int] = [
    0, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, -(2**63) - 1, 10**30, 10**400,
]  # fmt: skip
HOSTILE_FLOATS: list[float] = [
    math.nan, math.inf, -math.inf, 1e300, -1e300, 2.6e11, -1.0, 0.0, 5e-324,
]  # fmt: skip
HOSTILE_STRINGS: list[str] = ["", "\ud800", "a\udfffb", "x" * 300, "é", "job.assign.>", "\x00"]


def nested(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def _templates(job_id: str, at: float) -> dict[str, dict[str, Any]]:
    """A valid event of every type (for `job_id`), to mutate."""
    job = {"epoch": 1, "at": at, "job_id": job_id}
    run = {**job, "worker_id": "w", "attempt": 1, "lease": "l"}
    return {
        "leader_elected": {"epoch": 1, "at": at, "holder": "n"},
        "pruned": {"epoch": 1, "at": at, "before": at - 10},
        "worker_joined": {"epoch": 1, "at": at, "worker_id": "w", "subjects": ["job.assign.>"]},
        "credit_granted": {"epoch": 1, "at": at, "worker_id": "w", "credits": 2},
        "worker_heartbeat": {"epoch": 1, "at": at, "worker_id": "w"},
        "worker_lost": {"epoch": 1, "at": at, "worker_id": "w", "reason": "gone"},
        "enqueued": {
            **job,
            "client_id": "c",
            "exec": "image.resize",
            "payload": {"n": 1},
            "max_attempts": 3,
            "timeout_s": 30.0,
            "priority": 0,
            "not_before": None,
            "seq": 1,
        },
        "assigned": {**run, "deadline": at + 30},
        "reassigned": {**run, "attempt": 2, "previous_worker_id": "w", "deadline": at + 30},
        "job_heartbeat": {**run, "deadline": at + 30},
        "completed": {**run, "result": {"ok": True}},
        "requeued": {**run, "reason": "failed", "error": "boom", "seq": -1},
        "dead_lettered": {**run, "reason": "failed", "error": "boom"},
        "cancelled": dict(job),
        "redriven": {**job, "seq": 2},
    }


_PAYLOADS = st.one_of(
    st.sampled_from(
        [math.nan, math.inf, 2**64, nested(101), nested(99), {"\ud800": 1}, ["\udc00"], 10**30]
    ),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=4), children, max_size=3)
        ),
        max_leaves=12,
    ),
)

HOSTILE_VALUES = st.one_of(
    st.sampled_from(HOSTILE_INTS),
    st.sampled_from(HOSTILE_FLOATS),
    st.sampled_from(HOSTILE_STRINGS),
    st.sampled_from([None, True, [], {}, ["a"], {"a": 1}]),
    _PAYLOADS,
)


@st.composite
def hostile_event(draw: st.DrawFn, job_ids: tuple[str, ...] = ("h-1", "h-2", "h-3")) -> Any:
    """An event dict of a random type with 0 to 3 fields replaced, dropped or added."""
    at = draw(st.sampled_from([1_790_000_000.0, 1_790_000_500.0]))
    templates = _templates(draw(st.sampled_from(job_ids)), at)
    type_name = draw(st.sampled_from(sorted(templates)))
    event: dict[str, Any] = {"type": type_name, **templates[type_name]}
    for _ in range(draw(st.integers(0, 3))):
        field = draw(st.sampled_from(sorted(event)))
        action = draw(st.sampled_from(["replace", "replace", "replace", "drop", "add"]))
        if action == "replace":
            event[field] = draw(HOSTILE_VALUES)
        elif action == "drop":
            event.pop(field, None)
        else:
            event["surplus"] = draw(HOSTILE_VALUES)
    if draw(st.booleans()) and type_name in {"enqueued", "completed"}:
        event["payload" if type_name == "enqueued" else "result"] = draw(_PAYLOADS)
    return event


def _dumps(document: Any) -> bytes:
    # allow_nan: NaN / Infinity literals are what a hostile producer can write; ensure_ascii
    # turns lone surrogates into \\ud800 escapes, which the reader turns back into them.
    return json.dumps(document, allow_nan=True).encode()


@st.composite
def hostile_record(draw: st.DrawFn) -> bytes | None:
    """The value of one hostile `dispatch.events` record (None: a tombstone)."""
    kind = draw(st.sampled_from(["shaped", "shaped", "shaped", "shaped", "bytes", "deep", "none"]))
    if kind == "none":
        return None
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "deep":
        depth = draw(st.sampled_from([50, 120, 1_500, 50_000]))
        payload = "[" * depth + "]" * depth
        event = _templates("h-deep", 1_790_000_000.0)["enqueued"]
        head = json.dumps({"type": "enqueued", **event, "payload": None})[: -len("null}")]
        text = '{"v":1,"group":"default","epoch":1,"events":[' + head + payload + "}]}"
        return text.encode()
    header: dict[str, Any] = {"v": FORMAT_VERSION, "group": "default", "epoch": 1}
    if draw(st.integers(0, 4)) == 0:
        header[draw(st.sampled_from(["v", "group", "epoch"]))] = draw(HOSTILE_VALUES)
    events = draw(st.lists(hostile_event(), min_size=0, max_size=4))
    return _dumps({**header, "events": events})

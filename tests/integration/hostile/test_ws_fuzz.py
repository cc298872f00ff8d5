"""Property-based fuzzing of `WS /v1/stream`: hostile hello messages, then hostile worker
messages after a valid hello.

Each case must end in an answer, never in silence or a dropped connection: an `error` message,
or a close with a code and a reason (a valid hello is answered `welcome`); a close code of
1006 (no close frame) or 1011 (internal error) is a failure, as is any traceback in the
node's log. Afterwards the node still serves: a WebSocket worker takes and acks a job.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import ClientConnection, connect

from tests.integration.hostile.conftest import HostileStack

pytestmark = pytest.mark.integration

HELLO_EXAMPLES = 300
MESSAGE_EXAMPLES = 350
ANSWER_WAIT_S = 2.0
"""How long a case waits for the node's answer (an error message or a close)."""
FAILING_CLOSE_CODES = {1006, 1011}
PING = json.dumps({"type": "ping"})
SEND_LIMIT = 4 * 1024 * 1024
"""The client sends frames up to this size (the node must refuse what it finds too large)."""


@dataclass(frozen=True)
class Frame:
    label: str
    """What kind of hostile input this is (for the report)."""
    data: str | bytes
    must_answer: bool = True
    """False for a message that may be valid and get no reply (a credit grant)."""


# --- strategies ----------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
huge_texts = st.sampled_from([200, 1_000, 100_000]).map(lambda n: "w" * n)
odd_texts = st.one_of(
    st.text(max_size=40), huge_texts, st.sampled_from(["../x", "a/b", "é\u0000", "\ud7ff", " "])
)


def _deep(depth: int, opener: str = "[", closer: str = "]") -> str:
    return opener * depth + closer * depth


deep_json = st.integers(min_value=50, max_value=60_000).map(_deep)
deep_objects = st.integers(min_value=50, max_value=60_000).map(
    lambda depth: '{"a":' * depth + "1" + "}" * depth
)
many_subjects = st.integers(min_value=100, max_value=30_000).map(
    lambda count: [f"job.assign.s{n}.*" for n in range(count)]
)


def _frame(label: str, document: Any, *, must_answer: bool = True) -> Frame:
    return Frame(label, json.dumps(document), must_answer)


not_json = (
    st.text(min_size=1, max_size=200)
    .filter(lambda t: not _parses(t))
    .map(lambda text: Frame("not json", text))
)
binary = st.binary(min_size=0, max_size=300).map(lambda raw: Frame("binary", raw))
nan_literals = st.sampled_from(["NaN", "Infinity", "-Infinity"]).map(
    lambda literal: Frame(
        "nan literal",
        '{"type": "hello", "role": "worker", "worker_id": '
        f'"w", "subjects": ["job.assign.x"], "n": {literal}}}',
    )
)
deep_frames = st.one_of(deep_json, deep_objects).map(lambda text: Frame("deep nesting", text))
non_objects = json_values.filter(lambda value: not isinstance(value, dict)).map(
    lambda value: _frame("json not an object", value)
)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


hostile_hellos = st.one_of(
    not_json,
    binary,
    nan_literals,
    deep_frames,
    non_objects,
    st.fixed_dictionaries(
        {"type": st.just("hello"), "role": st.one_of(odd_texts, json_values)}
    ).map(lambda d: _frame("hello with a bad role", d)),
    st.fixed_dictionaries(
        {
            "type": st.just("hello"),
            "role": st.just("worker"),
            "worker_id": st.one_of(odd_texts, json_values),
            "subjects": st.one_of(
                json_values,
                st.lists(odd_texts, max_size=5),
                many_subjects,
                st.lists(
                    st.sampled_from(["job.assign.>", ">", "job.assign.*.*", "", "a..b"]), max_size=5
                ),
            ),
        }
    ).map(lambda d: _frame("worker hello with odd fields", d)),
    st.dictionaries(st.text(max_size=10), json_values, max_size=6).map(
        lambda d: _frame("object without hello", d)
    ),
)

settle_fields = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["ack", "fail", "heartbeat"]),
        "id": st.one_of(odd_texts, json_values),
        "attempt": st.one_of(st.integers(min_value=-(2**70), max_value=2**70), json_values),
        "lease": st.one_of(odd_texts, json_values),
    },
    optional={
        "result": st.one_of(json_values, deep_json),
        "error": json_values,
        "retryable": json_values,
    },
)
hostile_messages = st.one_of(
    not_json,
    binary,
    deep_frames,
    non_objects,
    st.fixed_dictionaries(
        {"type": st.just("credit"), "credits": st.integers(min_value=-(2**70), max_value=2**70)}
    ).map(lambda d: _frame("credit", d, must_answer=False)),
    st.fixed_dictionaries({"type": st.just("credit"), "credits": json_values})
    .filter(lambda d: not isinstance(d["credits"], int))
    .map(lambda d: _frame("credit with a wrong type", d)),
    settle_fields.map(lambda d: _frame("settlement with odd fields", d)),
    st.fixed_dictionaries(
        {"type": st.just("acks"), "acks": st.one_of(json_values, st.lists(json_values))}
    ).map(lambda d: _frame("acks with odd items", d)),
    st.fixed_dictionaries(
        {
            "type": st.one_of(odd_texts, json_values).filter(
                lambda t: t not in ("credit", "ping", "acks", "ack", "fail", "heartbeat")
            )
        }
    ).map(lambda d: _frame("unknown type", d)),
    st.just(
        Frame(
            "ack of 2 MiB",
            json.dumps(
                {"type": "ack", "id": "x", "attempt": 1, "lease": "l", "result": "x" * (2 << 20)}
            ),
        )
    ),
)


# --- one case ------------------------------------------------------------------------------------


@dataclass
class Tally:
    cases: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def fail(self, frame: Frame, why: str) -> None:
        preview = frame.data[:120]
        self.failures.append(f"{frame.label}: {why}; sent {preview!r}")


def _open(stack: HostileStack, role: str) -> ClientConnection:
    url = stack.leader.url.replace("http://", "ws://") + "/v1/stream"
    return connect(
        url, additional_headers=stack.headers(role), max_size=None, open_timeout=10,
        close_timeout=2, compression=None, proxy=None,
    )  # fmt: skip


def _answer(socket: ClientConnection) -> tuple[str, Any]:
    """The node's next answer: ("message", parsed), ("closed", (code, reason)) or
    ("silence", None)."""
    try:
        raw = socket.recv(timeout=ANSWER_WAIT_S)
    except TimeoutError:
        return "silence", None
    except ConnectionClosed as closed:
        received = closed.rcvd
        return "closed", (received.code, received.reason) if received else (1006, "")
    try:
        return "message", json.loads(raw)
    except ValueError:
        return "message", {"type": "?", "raw": str(raw)[:100]}


def _judge(frame: Frame, socket: ClientConnection, tally: Tally, *, after_hello: bool) -> None:
    kind, value = _answer(socket)
    if kind == "message" and isinstance(value, dict) and value.get("type") == "error":
        if not value.get("detail"):
            tally.fail(frame, f"an error without a detail: {value}")
        tally.outcomes["error message"] += 1
        if after_hello:
            return  # a worker's socket stays open after an error about one message
        # A refused hello is closed next: the close must carry a code and reason too.
        kind, value = _answer(socket)
        if kind != "closed":
            tally.fail(frame, f"a refused hello was not closed ({kind}: {value})")
            return
    if kind == "closed":
        code, reason = value
        tally.outcomes[f"closed {code}"] += 1
        if code in FAILING_CLOSE_CODES:
            tally.fail(frame, f"closed with {code} {reason!r}")
        elif not reason and code != 1009:  # 1009: too big, the standard reason is the code
            tally.fail(frame, f"closed with {code} and no reason")
        return
    if kind == "message":
        kind_of = value.get("type") if isinstance(value, dict) else "?"
        tally.outcomes[f"message {kind_of}"] += 1
        if kind_of not in ("welcome", "settled", "settled_many", "pong", "error") and after_hello:
            tally.fail(frame, f"unexpected answer {value}")
        return
    tally.outcomes["silence"] += 1
    if frame.must_answer:
        tally.fail(frame, f"no answer within {ANSWER_WAIT_S} s")


def _send(socket: ClientConnection, frame: Frame) -> bool:
    try:
        socket.send(frame.data)
    except ConnectionClosed:
        return False
    return True


@contextlib.contextmanager
def _welcome(stack: HostileStack, worker_id: str) -> Iterator[ClientConnection]:
    """A worker socket past its hello (the node answered `welcome`)."""
    with _open(stack, "worker") as socket:
        socket.send(json.dumps({"type": "hello", "role": "worker", "worker_id": worker_id,
                                "subjects": ["job.assign.hostile.ws.*"]}))  # fmt: skip
        welcome = json.loads(socket.recv(timeout=30))
        assert welcome.get("type") == "welcome", welcome
        yield socket


_SETTINGS = hypothesis.settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
)


def _ws_round_trip(stack: HostileStack) -> None:
    """A WebSocket worker takes a new job and acks it; the job succeeds."""
    job_id = f"ws-canary-{time.monotonic_ns()}"
    with stack.client("client") as client:
        submitted = client.post("/v1/jobs", json={"id": job_id, "exec": "hostile.ws.canary",
                                                  "payload": {}})  # fmt: skip
        assert submitted.status_code in (200, 202), submitted.text
        with _welcome(stack, f"ws-canary-{time.monotonic_ns()}") as socket:
            socket.send(json.dumps({"type": "credit", "credits": 1}))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                message = json.loads(socket.recv(timeout=30))
                if message.get("type") == "assign" and message["id"] == job_id:
                    socket.send(json.dumps({"type": "ack", "id": job_id, "attempt":
                                            message["attempt"], "lease": message["lease"],
                                            "result": {"ok": True}}))  # fmt: skip
                if message.get("type") == "settled" and message["id"] == job_id:
                    break
        job = client.get(f"/v1/jobs/{job_id}", params={"wait": 10}).json()
        assert job["status"] == "succeeded", job


@pytest.mark.timeout(600)
def test_hostile_websocket_input_gets_an_answer_and_no_traceback(
    hostile_stack: HostileStack,
) -> None:
    stack = hostile_stack
    epoch = stack.epoch()
    hellos, messages = Tally(), Tally()

    @hypothesis.settings(_SETTINGS, max_examples=HELLO_EXAMPLES)
    @given(frame=hostile_hellos, role=st.sampled_from(["worker", "client"]))
    def hello_case(frame: Frame, role: str) -> None:
        hellos.cases += 1
        try:
            with _open(stack, role) as socket:
                if _send(socket, frame):
                    _judge(frame, socket, hellos, after_hello=False)
        except InvalidHandshake as error:
            hellos.fail(frame, f"handshake refused: {error}")

    @hypothesis.settings(_SETTINGS, max_examples=MESSAGE_EXAMPLES)
    @given(frame=hostile_messages)
    def message_case(frame: Frame) -> None:
        messages.cases += 1
        with _welcome(stack, f"fuzz-{messages.cases}") as socket:
            if _send(socket, frame):
                if not frame.must_answer:
                    # No answer is due (a valid credit grant): the ping after it is answered
                    # `pong` once the node took the frame, instead of the case waiting out
                    # its silence. A close or an error in between is judged as before.
                    with contextlib.suppress(ConnectionClosed):
                        socket.send(PING)
                _judge(frame, socket, messages, after_hello=True)

    hello_case()
    message_case()
    report = {
        "hello": {"cases": hellos.cases, "outcomes": dict(hellos.outcomes),
                  "failures": hellos.failures[:40], "failure_count": len(hellos.failures)},
        "messages": {"cases": messages.cases, "outcomes": dict(messages.outcomes),
                     "failures": messages.failures[:40],
                     "failure_count": len(messages.failures)},
        "tracebacks": stack.tracebacks()[:40],
    }  # fmt: skip
    (stack.folder / "ws-fuzz-findings.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1)[:8000])
    assert hellos.cases + messages.cases >= 500
    assert stack.epoch() == epoch, "the leader's term ended during the fuzzing"
    _ws_round_trip(stack)
    assert not report["tracebacks"], report["tracebacks"]
    assert not hellos.failures and not messages.failures, json.dumps(report, indent=1)[:6000]

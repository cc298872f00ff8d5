"""The bench's load generator: reading answers off a keep-alive connection, the schedule of
requests, and a run against a small local HTTP server."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dispatch.bench.submitters import Plan, Refused, Submitters, _read_answer, main, sdk_loop

_BODY = b'{"id":"job-1","status":"queued","existing":false}'
ACCEPTED = (
    b"HTTP/1.1 202 Accepted\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\n"
    b"content-length: %d\r\ncontent-type: application/json\r\n\r\n%s" % (len(_BODY), _BODY)
)


PLAN = Plan(
    host="127.0.0.1", port=1, key="k", prefix="p", jobs=10, clients=2, batch=4, payload_bytes=3
)


def _plan(**changes: Any) -> Plan:
    return dataclasses.replace(PLAN, **changes)


def _read_all(data: bytes, answers: int) -> tuple[list[int], bytes]:
    """The statuses of `answers` answers read from a stream holding `data`, and what is left."""

    async def read() -> tuple[list[int], bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        statuses = [await _read_answer(reader) for _ in range(answers)]
        return statuses, await reader.read()

    return asyncio.run(read())


def test_an_answer_is_read_to_the_end_of_its_body() -> None:
    assert _read_all(ACCEPTED + b"HTTP/1.1", 1) == ([202], b"HTTP/1.1")


def test_two_answers_back_to_back_are_read_one_after_the_other() -> None:
    body = b'{"error":"conflict","detail":"job id \'x\' is taken"}'
    conflict = b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    assert _read_all(ACCEPTED + conflict, 2) == ([202, 409], b"")


@pytest.mark.parametrize(
    ("status_line", "status"),
    [
        (b"HTTP/1.1 200 OK", 200),
        (b"HTTP/1.1 503 Service Unavailable", 503),
        (b"HTTP/1.1 422 Unprocessable Content", 422),
        (b"HTTP/1.1 204", 204),
    ],
)
def test_the_status_is_the_status_lines_code(status_line: bytes, status: int) -> None:
    assert _read_all(status_line + b"\r\ncontent-length: 2\r\n\r\n{}", 1) == ([status], b"")


def test_an_answer_without_a_body_reads_only_its_head() -> None:
    assert _read_all(b"HTTP/1.1 204 No Content\r\nserver: x\r\n\r\n" + ACCEPTED, 2)[0] == [
        204,
        202,
    ]


def test_a_closed_connection_raises_connection_error() -> None:
    with pytest.raises(ConnectionError):
        _read_all(b"", 1)
    with pytest.raises(ConnectionError):
        _read_all(ACCEPTED, 2)


def test_closed_loop_hands_out_consecutive_batches_then_none() -> None:
    submitters = Submitters(_plan(jobs=10, batch=4))
    taken = [submitters._take() for _ in range(5)]
    assert taken == [(0, 0.0), (4, 0.0), (8, 0.0), None, None]


def test_open_loop_requests_are_due_at_start_plus_first_job_over_rate() -> None:
    submitters = Submitters(_plan(jobs=5, batch=2, rate=50.0))
    submitters._started = 100.0
    taken = [submitters._take() for _ in range(4)]
    assert taken[3] is None
    assert [first for first, _due in filter(None, taken)] == [0, 2, 4]
    assert [due for _first, due in filter(None, taken)] == pytest.approx([100.0, 100.04, 100.08])


def test_a_request_is_one_job_or_a_batch_with_its_content_length() -> None:
    one = Submitters(_plan(jobs=3, batch=1, key="sekret", prefix="b"))
    ids, request = one._request(2)
    head, _, body = request.partition(b"\r\n\r\n")
    assert ids == ["b-2"]
    assert head.startswith(b"POST /v1/jobs HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer sekret\r\n" in head
    assert f"\r\nContent-Length: {len(body)}".encode() in head
    assert json.loads(body) == {"id": "b-2", "exec": "bench.noop", "payload": "ppp"}

    batch = Submitters(_plan(jobs=10, batch=4, prefix="b"))
    ids, request = batch._request(8)
    head, _, body = request.partition(b"\r\n\r\n")
    assert ids == ["b-8", "b-9"]
    assert head.startswith(b"POST /v1/jobs:batch HTTP/1.1\r\n")
    assert [job["id"] for job in json.loads(body)["jobs"]] == ids


async def _serve(status: int) -> tuple[asyncio.Server, list[bytes], int]:
    """A keep-alive HTTP/1.1 server answering every request with `status`; the paths asked."""
    paths: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = b'{"jobs":[]}'
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the submitter closed its connection
                lines = head.split(b"\r\n")
                paths.append(lines[0].split(b" ")[1])
                [length] = [
                    int(line.partition(b":")[2])
                    for line in lines
                    if line.lower().startswith(b"content-length:")
                ]
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n" % (status, len(body)))
                writer.write(body)
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, paths, server.sockets[0].getsockname()[1]


def test_a_run_submits_every_job_over_its_connections() -> None:
    async def run() -> tuple[Submitters, list[bytes]]:
        server, paths, port = await _serve(202)
        async with server:
            submitters = Submitters(_plan(port=port, jobs=25, batch=4, clients=3))
            await submitters.run()
        return submitters, paths

    submitters, paths = asyncio.run(run())
    assert sorted(submitters.sent_at) == sorted(f"p-{n}" for n in range(25))
    assert paths == [b"/v1/jobs:batch"] * 7
    assert len(submitters.latencies) == 7
    report = submitters.report(1.0)
    assert (report["requests"], report["jobs"], report["behind_ms"]) == (7, 25, None)


def test_a_refused_submission_stops_the_run() -> None:
    async def run() -> None:
        server, _paths, port = await _serve(409)
        async with server:
            await Submitters(_plan(port=port, jobs=3, batch=1, clients=1)).run()

    with pytest.raises(Refused, match="p-0: HTTP 409"):
        asyncio.run(run())


def test_the_report_carries_the_processs_pid_and_its_cpu_while_submitting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An SDK loop of no jobs: nothing is sent, the report is still whole.
    plan = dataclasses.asdict(_plan(jobs=0, sdk=True))
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(plan)))
    main()
    report = json.loads(capsys.readouterr().out)
    assert report["pid"] == os.getpid()
    assert report["cpu_s"] >= 0
    assert report["jobs"] == 0


class _Node(ThreadingHTTPServer):
    """Answers each `POST /v1/jobs` 202 after a short pause, counting the calls in flight."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Accept)
        self.ids: list[str] = []
        self.in_flight = self.peak = 0
        self.lock = threading.Lock()


class _Accept(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the node's
    server: _Node

    def do_POST(self) -> None:
        job = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.ids.append(job["id"])
            self.server.in_flight += 1
            self.server.peak = max(self.server.peak, self.server.in_flight)
        time.sleep(0.01)  # long enough that concurrent callers overlap
        with self.server.lock:
            self.server.in_flight -= 1
        body = json.dumps({"id": job["id"], "status": "queued", "existing": False}).encode()
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def node() -> Iterator[_Node]:
    server = _Node()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("mode", "concurrent"),
    [({}, 1), ({"sdk_threads": 4}, 4), ({"sdk_async": 4}, 4)],
    ids=["sequential", "threads", "async"],
)
def test_the_sdk_loop_submits_each_job_once_with_as_many_calls_at_once_as_asked(
    node: _Node, mode: dict[str, int], concurrent: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK's gathering off: the calls themselves reach the server, as many at once as
    # asked (the gathering has tests of its own: tests/unit/sdk/test_submit_gathering.py).
    monkeypatch.setenv("DISPATCH_BENCH_SUBMITS_IN_FLIGHT", "0")
    plan = _plan(port=node.server_address[1], jobs=12, batch=1, sdk=True, **mode)
    report = sdk_loop(plan)
    assert sorted(node.ids) == sorted(f"p-{n}" for n in range(12))
    assert sorted(report["sent_at"]) == sorted(node.ids)
    assert (report["requests"], report["jobs"], report["behind_ms"]) == (12, 12, None)
    assert report["request_ms"]["p50"] >= 10
    # Sequential: one call at a time; otherwise they overlap (4 at once if scheduled so).
    assert node.peak == 1 if concurrent == 1 else 1 < node.peak <= concurrent

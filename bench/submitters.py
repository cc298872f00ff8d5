"""N concurrent submitters over keep-alive HTTP/1.1 connections, in a process of their own.

`dispatch bench` measures the node, so the load must cost it little: one submission through
httpx costs this machine ~0.5 ms of CPU, which at 5,000 requests/s is more than a core that
the node needs itself. Each submitter here is one keep-alive connection driven by asyncio
streams (the request written as bytes, the answer read by its `content-length`): ~40 µs a
request. A client of the dispatcher would use the SDK; `dispatch bench --sdk-loop` measures
that separately.

Closed loop (no rate): each submitter sends its next request when the previous one is
answered. Open loop (`rate`, jobs/s): the request whose first job is job k is due at
`start + k / rate` whatever the answers;
a submitter takes the next due request, so when every submitter is waiting for an answer the
schedule slips, and `behind_ms` says by how much (the rate asked for is then not the rate
measured: both are reported).

With `sdk`, the process runs one sequential loop of the SDK's `Client.submit` instead: a
user's first script. Or, to see what one client object serves when a program calls it
concurrently, the same calls spread over `sdk_threads` threads sharing one `Client`, or over
`sdk_async` tasks on one `AsyncClient`. In a process of its own, because in the bench's
process it would share the GIL with the bench's workers (their event loop wakes every 2 ms to
flush acks), and each hand-off costs up to the 5 ms switch interval.

Run as `python -m dispatch.bench.submitters` with a JSON plan on stdin; prints a JSON report on
stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import uvloop

from dispatch.bench.stats import percentiles
from dispatch.client import AsyncClient, Client


@dataclass(frozen=True)
class Plan:
    host: str
    port: int
    key: str
    prefix: str
    jobs: int
    clients: int
    batch: int
    payload_bytes: int
    rate: float | None = None
    sdk: bool = False
    """Instead: one sequential loop of the SDK's `Client.submit`, as a user's script would."""
    sdk_threads: int = 1
    """With `sdk`: the calls spread over this many threads sharing one `Client`."""
    sdk_async: int = 0
    """With `sdk`: instead, `AsyncClient.submit` from this many tasks on one client (0: no)."""


class Refused(Exception):
    """The node answered a submission with another status than 200/202."""


class Submitters:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.sent_at: dict[str, float] = {}
        """Wall time each job's request was written (the leader's clock is the same)."""
        self.latencies: list[float] = []
        """Seconds from writing a request to reading its whole answer."""
        self.behind: list[float] = []
        """Open loop: seconds each request left after its due time."""
        self._next = 0
        self._payload = "p" * plan.payload_bytes

    async def run(self) -> float:
        """Submit every job; returns the seconds from the first request to the last answer."""
        self._started = time.monotonic()
        await asyncio.gather(*(self._submitter() for _ in range(self.plan.clients)))
        return time.monotonic() - self._started

    def _take(self) -> tuple[int, float] | None:
        """The first job index of the next request and when it is due (monotonic)."""
        first = self._next
        if first >= self.plan.jobs:
            return None
        self._next = min(first + self.plan.batch, self.plan.jobs)
        rate = self.plan.rate
        return first, (self._started + first / rate) if rate else 0.0

    def _request(self, first: int) -> tuple[list[str], bytes]:
        plan = self.plan
        ids = [f"{plan.prefix}-{n}" for n in range(first, min(first + plan.batch, plan.jobs))]
        jobs = [{"id": job_id, "exec": "bench.noop", "payload": self._payload} for job_id in ids]
        if plan.batch == 1:
            path, body = "/v1/jobs", json.dumps(jobs[0]).encode()
        else:
            path, body = "/v1/jobs:batch", json.dumps({"jobs": jobs}).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {plan.host}:{plan.port}\r\n"
            f"Authorization: Bearer {plan.key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return ids, head.encode() + body

    async def _submitter(self) -> None:
        reader, writer = await asyncio.open_connection(self.plan.host, self.plan.port)
        try:
            while (taken := self._take()) is not None:
                first, due = taken
                if due:
                    delay = due - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    self.behind.append(max(0.0, time.monotonic() - due))
                ids, request = self._request(first)
                sent = time.time()
                began = time.perf_counter()
                writer.write(request)
                status = await _read_answer(reader)
                self.latencies.append(time.perf_counter() - began)
                if status not in (200, 202):
                    raise Refused(f"{ids[0]}: HTTP {status}")
                for job_id in ids:
                    self.sent_at[job_id] = sent
        finally:
            writer.close()

    def report(self, seconds: float) -> dict[str, Any]:
        requests = len(self.latencies)
        return {
            "requests": requests,
            "jobs": len(self.sent_at),
            "seconds": round(seconds, 3),
            "requests_per_s": round(requests / seconds, 1),
            "jobs_per_s": round(len(self.sent_at) / seconds, 1),
            "request_ms": percentiles(self.latencies),
            "behind_ms": percentiles(self.behind) if self.behind else None,
            "sent_at": self.sent_at,
        }


async def _read_answer(reader: asyncio.StreamReader) -> int:
    """Read one HTTP/1.1 answer (the node always sends `content-length`); its status."""
    status, _ = await read_answer(reader)
    return status


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 answer (the node always sends `content-length`): status and body."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the node closed the connection")
    status = int(status_line.split(b" ", 2)[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, (await reader.readexactly(length) if length else b"")


def sdk_loop(plan: Plan) -> dict[str, Any]:
    """`Client.submit` in a sequential loop: the figure a user's first script sees. With
    `sdk_threads` or `sdk_async`, the same calls made concurrently through one client object,
    as a program shares one: each thread or task takes the next job number when its call is
    answered (a closed loop, like the submitters')."""
    payload = "p" * plan.payload_bytes
    latencies: list[float] = []
    sent_at: dict[str, float] = {}
    # One iterator for all: under the GIL each `next` hands a number to one caller only.
    numbers = iter(range(plan.jobs))

    def submit(client: Client) -> None:
        for n in numbers:
            job_id = f"{plan.prefix}-{n}"
            sent_at[job_id] = time.time()
            began = time.perf_counter()
            client.submit("bench.noop", payload, id=job_id)
            latencies.append(time.perf_counter() - began)

    async def submit_async(client: AsyncClient) -> None:
        for n in numbers:
            job_id = f"{plan.prefix}-{n}"
            sent_at[job_id] = time.time()
            began = time.perf_counter()
            await client.submit("bench.noop", payload, id=job_id)
            latencies.append(time.perf_counter() - began)

    # `DISPATCH_BENCH_SUBMITS_IN_FLIGHT=0` turns the SDK's gathering of concurrent submits off
    # (every call its own request): the baseline its figures are measured against.
    in_flight = os.environ.get("DISPATCH_BENCH_SUBMITS_IN_FLIGHT")
    options: dict[str, Any] = {}
    if in_flight is not None:
        options["max_submits_in_flight"] = int(in_flight) or None

    async def run_async() -> None:
        async with AsyncClient(url, plan.key, **options) as client:
            await asyncio.gather(*(submit_async(client) for _ in range(plan.sdk_async)))

    url = f"http://{plan.host}:{plan.port}"
    started = time.monotonic()
    if plan.sdk_async:
        # The standard event loop, not uvloop: the one a user's `asyncio.run` gets.
        asyncio.run(run_async())
    else:
        with Client(url, plan.key, **options) as client:
            if plan.sdk_threads == 1:
                submit(client)
            else:
                with ThreadPoolExecutor(plan.sdk_threads) as pool:
                    # `result()` raises a thread's error here, not in a log line.
                    for future in [pool.submit(submit, client) for _ in range(plan.sdk_threads)]:
                        future.result()
    seconds = time.monotonic() - started
    rate = round(plan.jobs / seconds, 1)
    return {"requests": plan.jobs, "jobs": plan.jobs, "seconds": round(seconds, 3),
            "requests_per_s": rate, "jobs_per_s": rate, "request_ms": percentiles(latencies),
            "behind_ms": None, "sent_at": sent_at}  # fmt: skip


def main() -> None:
    plan = Plan(**json.load(sys.stdin))
    # This process's CPU while it submits (`cpu_s`: all its threads), for the bench's CPU per
    # job by process; its start-up (the interpreter, the imports) is what the bench's count
    # of its ended children holds beyond it.
    cpu_before = time.process_time()
    if plan.sdk:
        report = sdk_loop(plan)
    else:
        submitters = Submitters(plan)
        # uvloop (installed with uvicorn[standard]) halves the generator's own cost per request.
        seconds = uvloop.run(submitters.run())
        report = submitters.report(seconds)
    report["cpu_s"] = round(time.process_time() - cpu_before, 4)
    report["pid"] = os.getpid()
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()

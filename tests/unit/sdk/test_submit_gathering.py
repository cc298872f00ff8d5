"""Concurrent single submits share requests, and every caller still gets its own answer:
`dispatch.submit_gathering` with fake senders (the real node: tests/integration/sdk)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from dispatch.client import Invalid, Unavailable
from dispatch.submit_gathering import MAX_GATHERED, AsyncGatherer, ThreadGatherer

Body = dict[str, Any]


class Sender:
    """Answers each job with its `n`; refuses a request holding a job marked `bad` (as the
    server refuses a whole batch); counts requests and how many were on their way at once."""

    def __init__(self, delay_s: float = 0.002, failure: BaseException | None = None) -> None:
        self.delay_s = delay_s
        self.failure = failure
        self.requests: list[int] = []
        self.on_the_way = 0
        self.most_on_the_way = 0
        self._lock = threading.Lock()

    def _enter(self, size: int) -> None:
        with self._lock:
            self.requests.append(size)
            self.on_the_way += 1
            self.most_on_the_way = max(self.most_on_the_way, self.on_the_way)

    def _leave(self) -> None:
        with self._lock:
            self.on_the_way -= 1

    def _answer(self, bodies: list[Body]) -> list[int]:
        if self.failure is not None:
            raise self.failure
        if any(body.get("bad") for body in bodies):
            raise Invalid("jobs[1].exec: bad", error="invalid", status=422)
        return [body["n"] for body in bodies]

    def one(self, body: Body) -> int:
        self._enter(1)
        try:
            time.sleep(self.delay_s)
            return self._answer([body])[0]
        finally:
            self._leave()

    def many(self, bodies: list[Body]) -> list[int]:
        self._enter(len(bodies))
        try:
            time.sleep(self.delay_s)
            return self._answer(bodies)
        finally:
            self._leave()

    async def one_async(self, body: Body) -> int:
        self._enter(1)
        try:
            await asyncio.sleep(self.delay_s)
            return self._answer([body])[0]
        finally:
            self._leave()

    async def many_async(self, bodies: list[Body]) -> list[int]:
        self._enter(len(bodies))
        try:
            await asyncio.sleep(self.delay_s)
            return self._answer(bodies)
        finally:
            self._leave()


def in_threads(gatherer: ThreadGatherer[int], jobs: int, threads: int) -> dict[int, int]:
    numbers = iter(range(jobs))
    lock = threading.Lock()
    answers: dict[int, int] = {}

    def work() -> None:
        while True:
            with lock:
                n = next(numbers, None)
            if n is None:
                return
            answers[n] = gatherer.submit({"n": n})

    running = [threading.Thread(target=work) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(30)
    return answers


def test_a_caller_alone_sends_each_job_at_once_in_a_request_of_its_own() -> None:
    sender = Sender(delay_s=0)
    gatherer = ThreadGatherer(sender.one, sender.many, 1)
    assert [gatherer.submit({"n": n}) for n in range(20)] == list(range(20))
    assert sender.requests == [1] * 20


@pytest.mark.parametrize("in_flight", [1, 3])
def test_threads_share_requests_and_each_gets_its_own_answer(in_flight: int) -> None:
    sender = Sender()
    answers = in_threads(ThreadGatherer(sender.one, sender.many, in_flight), 2000, 16)
    assert answers == {n: n for n in range(2000)}
    assert sum(sender.requests) == 2000
    assert len(sender.requests) < 2000 / 3, "16 callers should share requests"
    assert sender.most_on_the_way <= in_flight
    assert max(sender.requests) <= MAX_GATHERED


def test_a_refused_request_is_sent_again_job_by_job_so_only_the_bad_job_fails() -> None:
    sender = Sender(delay_s=0.02)
    gatherer = ThreadGatherer(sender.one, sender.many, 1)
    outcomes: dict[int, object] = {}

    def submit(n: int) -> None:
        try:
            outcomes[n] = gatherer.submit({"n": n, "bad": n == 3})
        except Invalid as refused:
            outcomes[n] = refused

    first = threading.Thread(target=submit, args=(0,))
    first.start()
    time.sleep(0.005)  # the others gather behind the first request
    others = [threading.Thread(target=submit, args=(n,)) for n in range(1, 6)]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(10)
    assert isinstance(outcomes.pop(3), Invalid)
    assert outcomes == {0: 0, 1: 1, 2: 2, 4: 4, 5: 5}
    assert sender.requests[:2] == [1, 5] and sender.requests[2:] == [1] * 5


def test_a_failure_past_the_retries_is_every_gathered_callers() -> None:
    sender = Sender(failure=Unavailable("no node answered", status=None))
    gatherer = ThreadGatherer(sender.one, sender.many, 1)
    failures: list[BaseException] = []

    def submit(n: int) -> None:
        with pytest.raises(Unavailable) as raised:
            gatherer.submit({"n": n})
        failures.append(raised.value)

    running = [threading.Thread(target=submit, args=(n,)) for n in range(8)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(10)
    assert len(failures) == 8
    assert sum(sender.requests) == 8  # a gathered request's failure is not retried job by job


def test_tasks_share_requests_and_each_gets_its_own_answer() -> None:
    sender = Sender()

    async def run() -> list[int]:
        gatherer = AsyncGatherer(sender.one_async, sender.many_async, 1)
        return await asyncio.gather(*(gatherer.submit({"n": n}) for n in range(1000)))

    assert asyncio.run(run()) == list(range(1000))
    assert sum(sender.requests) == 1000 and len(sender.requests) < 20
    assert sender.most_on_the_way == 1


def test_a_cancelled_caller_never_stalls_the_others() -> None:
    """Cancelled while waiting for its turn, and cancelled while sending for others: every
    other caller still gets its answer, and later submits still go."""
    sender = Sender(delay_s=0.05)

    async def run() -> None:
        gatherer = AsyncGatherer(sender.one_async, sender.many_async, 1)
        sending = asyncio.create_task(gatherer.submit({"n": 0}))
        await asyncio.sleep(0.01)
        waiting = [asyncio.create_task(gatherer.submit({"n": n})) for n in range(1, 6)]
        await asyncio.sleep(0.01)
        waiting[0].cancel()  # waiting for its turn
        sending.cancel()  # mid-request: nobody else was in it
        assert await asyncio.wait_for(asyncio.gather(*waiting[1:]), 5) == [2, 3, 4, 5]
        # A task sending a request that holds others' jobs is cancelled mid-request: their
        # jobs go back to the queue and the next turn sends them.
        first = asyncio.create_task(gatherer.submit({"n": 6}))
        await asyncio.sleep(0.01)
        carrier, carried = (asyncio.create_task(gatherer.submit({"n": n})) for n in (7, 8))
        await asyncio.sleep(0.05)  # `first` came back: `carrier` sends 7 and 8
        behind = [asyncio.create_task(gatherer.submit({"n": n})) for n in (9, 10)]
        await asyncio.sleep(0.01)
        carrier.cancel()
        assert await asyncio.wait_for(asyncio.gather(first, carried, *behind), 5) == [6, 8, 9, 10]
        assert carrier.cancelled()
        assert sender.requests[-2:] == [2, 3]  # [7, 8], then [8, 9, 10]
        assert await asyncio.wait_for(gatherer.submit({"n": 99}), 5) == 99

    asyncio.run(run())

"""`dispatch.api.prefetch.Prefetcher`: batches handed over in order, one ahead at most, a wake-up
ends a wait at once, a fetch's failure reaches the owner, and close stops the thread."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import pytest

from dispatch.api.prefetch import Prefetcher


class Source:
    """A fetch that returns what the test feeds it (None after a short wait, as a poll that
    found nothing), counting its calls."""

    def __init__(self) -> None:
        self.fed: queue.Queue[int | Exception] = queue.Queue()
        self.calls = 0

    def fetch(self) -> int | None:
        self.calls += 1
        try:
            item = self.fed.get(timeout=0.01)
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            raise item
        return item


@pytest.fixture
def source() -> Source:
    return Source()


@pytest.fixture
def prefetcher(source: Source) -> Iterator[Prefetcher[int]]:
    fetcher: Prefetcher[int] = Prefetcher(source.fetch, name="test-fetch")
    fetcher.start()
    yield fetcher
    assert fetcher.close(2.0), "the fetch thread did not stop"


def test_batches_come_in_order_and_none_is_fetched_beyond_the_one_waiting(
    source: Source, prefetcher: Prefetcher[int]
) -> None:
    for batch in (1, 2, 3):
        source.fed.put(batch)
    deadline = time.monotonic() + 10
    while source.fed.qsize() > 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    # One batch waits for the owner; the fetch thread waits for it to be taken.
    time.sleep(0.1)
    assert source.fed.qsize() == 2
    assert [prefetcher.take(1.0) for _ in range(3)] == [1, 2, 3]
    assert prefetcher.take(0.05) is None


def test_a_wake_ends_a_wait_at_once_and_only_one(prefetcher: Prefetcher[int]) -> None:
    threading.Timer(0.05, prefetcher.wake).start()
    started = time.monotonic()
    assert prefetcher.take(30.0) is None
    assert time.monotonic() - started < 10.0
    # The wake-up was used: the next wait lasts its time.
    started = time.monotonic()
    assert prefetcher.take(0.2) is None
    assert time.monotonic() - started >= 0.2
    # A wake-up before the wait ends the wait before it starts.
    prefetcher.wake()
    started = time.monotonic()
    assert prefetcher.take(30.0) is None
    assert time.monotonic() - started < 10.0


def test_a_failed_fetch_is_raised_to_the_owner_after_what_came_before_it(
    source: Source, prefetcher: Prefetcher[int]
) -> None:
    source.fed.put(7)
    source.fed.put(ConnectionError("broker gone"))
    assert prefetcher.take(1.0) == 7
    for _ in range(2):  # every later take: the term must end on it
        with pytest.raises(ConnectionError, match="broker gone"):
            prefetcher.take(1.0)


def test_close_stops_fetching(source: Source) -> None:
    fetcher: Prefetcher[int] = Prefetcher(source.fetch, name="test-fetch")
    fetcher.start()
    time.sleep(0.05)
    assert fetcher.close(2.0)
    calls = source.calls
    time.sleep(0.05)
    assert source.calls == calls

"""A fetch loop on a thread of its own, whose owner waits for its batches *or* a wake-up.

Why: the leader's loop waits for two things at once, submissions from the log and commands
from its mailbox. A Kafka consumer's poll can only wait for the first, so the loop used to
poll it every 5 ms to keep a command's wait short: an idle leader spent a third of a core on
those polls (kafka-python hands each one to its I/O thread and back). With the consumer
polled here instead, the loop waits on one condition that a fetched batch, a command
(`wake`) or its next timer ends, and sleeps while nothing happens (docs/architecture.md,
*The loop sleeps when idle*).

At most one batch is fetched ahead of the owner: the fetch behind it waits until the owner
took it, so what is fetched is consumed in order and memory stays bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

Batch = TypeVar("Batch")


class Prefetcher(Generic[Batch]):
    """Calls `fetch` over and over on a daemon thread; `take` hands over what it returned.

    `fetch` returns a batch, or None when it found nothing within its own wait (it must
    return within a bounded time: `close` waits for it). An exception it raises ends the
    thread and is raised by every later `take` (the owner's term fails on it, as it would
    have had it polled itself)."""

    def __init__(self, fetch: Callable[[], Batch | None], *, name: str) -> None:
        self._fetch = fetch
        # One lock, two conditions: a wake-up (one per command under load) wakes the owner
        # only, and the fetch thread wakes only when its batch was taken.
        lock = threading.Lock()
        self._arrived = threading.Condition(lock)
        """A batch, an error or a wake-up for the owner."""
        self._taken = threading.Condition(lock)
        """Room for the next batch, or closing, for the fetch thread."""
        self._pending: Batch | None = None
        """A fetched batch the owner has not taken yet."""
        self._error: BaseException | None = None
        self._woken = False
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._taken:
                    while self._pending is not None and not self._closing:
                        self._taken.wait()
                    if self._closing:
                        return
                batch = self._fetch()
                if batch is not None:
                    with self._arrived:
                        self._pending = batch
                        self._arrived.notify()
        except Exception as error:  # noqa: BLE001  (handed to the owner, raised by `take`)
            with self._arrived:
                self._error = error
                self._arrived.notify()

    def take(self, timeout_s: float) -> Batch | None:
        """The next batch; None when none came within `timeout_s` or `wake` was called
        (since the last `take`). Raises what `fetch` raised, once no batch is left."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while self._pending is None and self._error is None and not self._woken:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._arrived.wait(remaining)
            self._woken = False
            batch, self._pending = self._pending, None
            if batch is None:
                if self._error is not None:
                    raise self._error
                return None
            self._taken.notify()
            return batch

    def wake(self) -> None:
        """Make a `take` under way, or the next one, return at once."""
        with self._arrived:
            self._woken = True
            self._arrived.notify()

    def close(self, timeout_s: float) -> bool:
        """Stop fetching; False when the fetch under way did not return within `timeout_s`
        (the thread is then left to end by itself)."""
        with self._taken:
            self._closing = True
            self._taken.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

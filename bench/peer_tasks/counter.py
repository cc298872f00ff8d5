"""Completions counted in the run's Redis, from inside the task (needs the `peers` extra).

Why a counter and not the result backend: the end-to-end clock stops when the last task has
run, and one INCR per task is the cheapest correct way to know it. A result backend would cost
each task a SET of its result plus a PUBLISH, and the bench a wait on 20,000 results (Dramatiq
has no backend by default at all). The INCR runs on the same Redis as the queue, at the end of
the task's body, before the worker's (late) ack: the counter only moves when the task ran. The
task whose INCR reaches the expected count stamps `time.time()`, so the bench reads the end of
the run exactly instead of polling for it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import cast

import redis

from dispatch.bench.peer_tasks import DONE_KEY, EXPECTED_ENV, FINISHED_KEY, READY_KEY, REDIS_URL_ENV


class Counter:
    """One per worker process; the Redis client is made on first use, after the fork."""

    def __init__(self) -> None:
        self._client: redis.Redis | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def client(self) -> redis.Redis:
        # A prefork pool forks after import: a client made in the parent must not be shared.
        with self._lock:
            if self._client is None or self._pid != os.getpid():
                self._client = redis.Redis.from_url(os.environ[REDIS_URL_ENV])
                self._pid = os.getpid()
            return self._client

    def completed(self) -> None:
        """Count one completion; the one that reaches the expected count stamps the time."""
        client = self.client()
        # redis-py types replies of its sync and async clients alike (`Awaitable | Any`).
        done = cast(int, client.incr(DONE_KEY))
        if done == int(os.environ.get(EXPECTED_ENV, "0")):
            client.set(FINISHED_KEY, repr(time.time()))

    def ready(self) -> None:
        """Tell the bench that this worker process consumes."""
        self.client().sadd(READY_KEY, str(os.getpid()))


COUNTER = Counter()

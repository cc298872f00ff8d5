"""What `dispatch.bench.peers` runs beside dispatch: a Redis server of its own, a Celery app and a
Dramatiq actor (each a no-op task that counts its completions in Redis).

`celery_app`, `dramatiq_app` and `counter` need the `peers` extra (celery, dramatiq, redis):
only the bench and the worker processes it starts import them. This module and
`redis_server` need nothing beyond the standard library, so `dispatch.bench.peers` and its tests
import them anywhere (CI does not install the extra).
"""

from __future__ import annotations

REDIS_URL_ENV = "PEERS_REDIS_URL"
"""The environment variable that gives a worker process the Redis URL of the run."""
EXPECTED_ENV = "PEERS_EXPECTED"
"""How many completions the run expects: the task whose completion reaches it stamps the time."""

DONE_KEY = "peers:done"
"""The number of tasks that completed (INCR by each task)."""
FINISHED_KEY = "peers:finished_at"
"""`time.time()` when the completion count reached EXPECTED_ENV, set by that task."""
READY_KEY = "peers:ready"
"""A set of the pids of worker processes ready to consume."""

CELERY_PREFETCH_MULTIPLIER = 4
"""Celery's default `worker_prefetch_multiplier`. Each pool process may hold this many
unacknowledged messages; with late acks a message held by a worker that dies is delivered
again, so prefetching loses nothing."""

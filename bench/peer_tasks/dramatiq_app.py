"""The Dramatiq side of `dispatch.bench.peers` (needs the `peers` extra): one no-op actor.

Dramatiq's Redis broker acks after processing by default: a fetched message moves to the
worker's ack set and leaves it only when the actor has returned (a dead worker's set is put
back on the queue), which is Celery's `task_acks_late=True`.

The workers: `python -m dramatiq dispatch.bench.peer_tasks.dramatiq_app:broker --processes 2
--threads 8`, with the Redis URL in PEERS_REDIS_URL. The bench builds its own broker and
actor with `make_broker(url)` for each Redis it starts.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware

from dispatch.bench.peer_tasks import REDIS_URL_ENV
from dispatch.bench.peer_tasks.counter import COUNTER

ACTOR_NAME = "noop"


# Without the extra installed (CI), Middleware is Any, which strict mypy refuses to subclass;
# with it, the ignore is unused.
class Ready(Middleware):  # type: ignore[misc, unused-ignore]
    """Tells the bench when a worker process has started consuming."""

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        COUNTER.ready()


def _noop() -> None:
    COUNTER.completed()


def make_broker(redis_url: str) -> tuple[RedisBroker, dramatiq.Actor[[], None]]:
    # RedisBroker's __init__ has no annotations; without the extra installed (CI) mypy sees
    # Any here and the ignore is unused, hence `unused-ignore` beside it.
    broker = RedisBroker(url=redis_url)  # type: ignore[no-untyped-call, unused-ignore]
    broker.add_middleware(Ready())
    # No retries: a no-op that failed is a broken bench, not something to try again.
    noop: dramatiq.Actor[[], None] = dramatiq.actor(
        actor_name=ACTOR_NAME, broker=broker, max_retries=0
    )(_noop)
    return broker, noop


# The worker processes: the bench sets the URL. The bench's own process never has it set.
if REDIS_URL_ENV in os.environ:
    broker, noop = make_broker(os.environ[REDIS_URL_ENV])
    dramatiq.set_broker(broker)

"""The Celery side of `dispatch.bench.peers` (needs the `peers` extra): one no-op task, late acks.

The worker: `python -m celery -A dispatch.bench.peer_tasks.celery_app worker ...`, with the Redis
URL in PEERS_REDIS_URL. The bench itself builds its own app with `make_app(url)` for each Redis it
starts, so that nothing here depends on the environment of the bench's process.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_ready

from dispatch.bench.peer_tasks import CELERY_PREFETCH_MULTIPLIER, REDIS_URL_ENV
from dispatch.bench.peer_tasks.counter import COUNTER

TASK_NAME = "peers.noop"


def _noop() -> None:
    COUNTER.completed()


def _on_worker_ready(**_kwargs: Any) -> None:
    COUNTER.ready()


def make_app(redis_url: str) -> Celery:
    app = Celery("peers", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=CELERY_PREFETCH_MULTIPLIER,
        # No result backend: completions are counted by the task itself (see counter.py).
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    # Not a decorator: celery has no type information, and strict mypy refuses untyped ones.
    app.task(name=TASK_NAME)(_noop)
    return app


# The worker process: the bench sets the URL. The bench's own process never has it set.
if REDIS_URL_ENV in os.environ:
    app = make_app(os.environ[REDIS_URL_ENV])
    worker_ready.connect(_on_worker_ready, weak=False)

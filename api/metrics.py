"""Prometheus metrics of one node (`GET /metrics`), in a registry of its own."""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from dispatch.core.dispatcher import Dispatcher
from dispatch.core.events import (
    Assigned,
    Completed,
    DeadLettered,
    Enqueued,
    Event,
    Reassigned,
    Requeued,
)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
MAX_EXEC_LABELS = 100
"""Distinct `exec` label values of `dispatch_queue_depth`: the first execs seen keep their
own series, every later one is summed under OTHER_EXEC. Each label value is a series on
every scrape, and every exec name is the client's choice: 10,000 of them made /metrics
1.36 MB."""
OTHER_EXEC = "*"
"""The label of the execs beyond MAX_EXEC_LABELS: a wildcard, never a valid exec name."""
QUEUE_DEPTH_EVERY_S = 0.5
"""With more than MAX_EXEC_LABELS exec queues, the queue depth gauges are refreshed at most
this often (a refresh walks every queue, and the leader commits hundreds of times a
second); with fewer, after every commit."""


class Metrics:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._depth_refreshed_at: float | None = None
        self._queue_count = 0
        self._exec_labels: set[str] = set()
        """The exec names that have a series of their own (at most MAX_EXEC_LABELS)."""
        self.registry = CollectorRegistry()
        registry = self.registry
        self.queue_depth = Gauge(
            "dispatch_queue_depth", "Queued jobs per exec", ["exec", "state"], registry=registry
        )
        self.in_flight = Gauge("dispatch_in_flight", "Running jobs", registry=registry)
        self.is_leader = Gauge("dispatch_is_leader", "1 on the leader", registry=registry)
        self.epoch = Gauge("dispatch_epoch", "The leader epoch this node serves", registry=registry)
        self.enqueued = Counter("dispatch_enqueued", "Jobs enqueued", registry=registry)
        self.assigned = Counter(
            "dispatch_assigned", "Assignments (incl. reassignments)", registry=registry
        )
        self.completed = Counter("dispatch_completed", "Jobs succeeded", registry=registry)
        self.dead = Counter("dispatch_dead", "Jobs dead-lettered", registry=registry)
        self.requeued = Counter("dispatch_requeued", "Jobs requeued", registry=registry)
        self.dispatch_latency = Histogram(
            "dispatch_dispatch_latency_seconds",
            "Submission to first assignment",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.commit_seconds = Histogram(
            "dispatch_commit_seconds",
            "Kafka transaction commit time of one loop iteration",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )

        self.streaming_lag = Gauge(
            "dispatch_streaming_lag_records",
            "Records in Kafka not yet folded into the Delta tables, per topic",
            ["topic"],
            registry=registry,
        )
        self.streaming_batch_age = Gauge(
            "dispatch_streaming_last_batch_age_seconds",
            "Seconds since the streaming fold last committed `jobs` (-1: no batch yet)",
            registry=registry,
        )

    def observe_committed(self, core: Dispatcher, events: Sequence[Event]) -> None:
        """Called on the leader thread after each commit."""
        for event in events:
            if isinstance(event, Assigned):
                self.assigned.inc()
                if event.attempt == 1:
                    job = core.job_view(event.job_id)
                    if job is not None:
                        self.dispatch_latency.observe(max(0.0, event.at - job.submitted_at))
            elif isinstance(event, Reassigned):
                self.assigned.inc()
            elif isinstance(event, Enqueued):
                self.enqueued.inc()
            elif isinstance(event, Completed):
                self.completed.inc()
            elif isinstance(event, DeadLettered):
                self.dead.inc()
            elif isinstance(event, Requeued):
                self.requeued.inc()
        self.in_flight.set(core.counts()["running"])
        now = self._clock()
        refreshed = self._depth_refreshed_at
        if (
            refreshed is None
            or self._queue_count <= MAX_EXEC_LABELS
            or now - refreshed >= QUEUE_DEPTH_EVERY_S
        ):
            self._depth_refreshed_at = now
            self.refresh_queue_depth(core)

    def refresh_queue_depth(self, core: Dispatcher) -> None:
        """Set `dispatch_queue_depth` from the core's queues, within MAX_EXEC_LABELS."""
        ready: Tally[str] = Tally()
        delayed: Tally[str] = Tally()
        labels = self._exec_labels
        queues = core.queue_stats()
        self._queue_count = len(queues)
        for stats in queues:
            label = stats.exec
            if label not in labels:
                if len(labels) < MAX_EXEC_LABELS:
                    labels.add(label)
                else:
                    label = OTHER_EXEC
            ready[label] += stats.ready
            delayed[label] += stats.delayed
        for label in ready:
            self.queue_depth.labels(label, "ready").set(ready[label])
            self.queue_depth.labels(label, "delayed").set(delayed[label])

    def render(self) -> bytes:
        return generate_latest(self.registry)

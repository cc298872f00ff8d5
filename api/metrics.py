"""Prometheus metrics of one node (`GET /metrics`), in a registry of its own."""

from __future__ import annotations

from collections.abc import Sequence

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


class Metrics:
    def __init__(self) -> None:
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
        running = 0
        for stats in core.queue_stats():
            self.queue_depth.labels(stats.exec, "ready").set(stats.ready)
            self.queue_depth.labels(stats.exec, "delayed").set(stats.delayed)
            running += stats.running
        self.in_flight.set(running)

    def render(self) -> bytes:
        return generate_latest(self.registry)

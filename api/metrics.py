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
from dispatch.core.queries import ClientLoad

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
TENANT_SERIES = 20
"""Clients with `dispatch_tenant_*` series of their own unless settings say otherwise
(`tenants.metrics_clients`): those with the most queued jobs, then the most running."""
OTHER_CLIENTS = "other"
"""The `client` label of the sum of every other client (a client named "other" is always in
it, so the label is never ambiguous)."""
TENANT_WALK_EVERY_COMMIT = 2_000
"""While the last refresh of the per-tenant gauges walked at most this many client lanes,
delayed and running jobs (`Dispatcher.client_loads`; ~1 ms), they are refreshed after every commit,
so they are exact; beyond it, at most every TENANT_LOAD_EVERY_S (the leader commits hundreds
of times a second), and an idle leader may show the state of up to that long before its last
commit."""
TENANT_LOAD_EVERY_S = 1.0


def top_clients(
    loads: dict[str, ClientLoad], limit: int
) -> tuple[dict[str, ClientLoad], ClientLoad, int]:
    """The `limit` clients with the most queued jobs (then running jobs, then by id), and the
    sum and number of all the others: at most `limit` + 1 series whatever the client count."""
    ranked = sorted(
        (client for client in loads if client != OTHER_CLIENTS),
        key=lambda client: (-loads[client].queued, -loads[client].running, client),
    )
    kept = {client: loads[client] for client in ranked[:limit]}
    rest = ClientLoad()
    others = 0
    for client, load in loads.items():
        if client not in kept:
            rest.add(load)
            others += 1
    return kept, rest, others


class Metrics:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, tenant_series: int = TENANT_SERIES
    ) -> None:
        self._clock = clock
        self.tenant_series = tenant_series
        """Clients with series of their own (the rest are summed under OTHER_CLIENTS)."""
        self._tenants_refreshed_at: float | None = None
        self._tenant_walk = 0
        self._tenant_labels: set[str] = set()
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

        self.tenant_queued = Gauge(
            "dispatch_tenant_queued",
            "Queued jobs per client (the deepest clients; the rest summed as client=other)",
            ["client"],
            registry=registry,
        )
        self.tenant_running = Gauge(
            "dispatch_tenant_running",
            "Running jobs per client (the deepest clients; the rest summed as client=other)",
            ["client"],
            registry=registry,
        )
        self.tenant_other_clients = Gauge(
            "dispatch_tenant_other_clients",
            "Clients with queued or running jobs summed under client=other",
            registry=registry,
        )

        self.forwarded = Counter(
            "dispatch_forwarded",
            "Client calls a follower forwarded to the leader, by outcome: relayed (the "
            "leader's answer, whatever its status), unreachable (503), lost (502 or 504), "
            "no_leader (503, none known)",
            ["outcome"],
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
        tenants_at = self._tenants_refreshed_at
        if (
            tenants_at is None
            or self._tenant_walk <= TENANT_WALK_EVERY_COMMIT
            or now - tenants_at >= TENANT_LOAD_EVERY_S
        ):
            self._tenants_refreshed_at = now
            self.refresh_tenants(core)

    def refresh_tenants(self, core: Dispatcher) -> None:
        """Set the `dispatch_tenant_*` gauges: the top `tenant_series` clients by queue depth
        and one `other` series; clients that left the top lose their series."""
        loads = core.client_loads()
        self._tenant_walk = loads.visited
        kept, rest, others = top_clients(loads.per_client(), self.tenant_series)
        for gone in self._tenant_labels - kept.keys():
            self.tenant_queued.remove(gone)
            self.tenant_running.remove(gone)
        self._tenant_labels = set(kept)
        for client, load in [*kept.items(), (OTHER_CLIENTS, rest)]:
            self.tenant_queued.labels(client).set(load.queued)
            self.tenant_running.labels(client).set(load.running)
        self.tenant_other_clients.set(others)

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

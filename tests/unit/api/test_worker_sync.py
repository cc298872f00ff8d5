"""A worker's rejoin keeps its credit exact: a property test over the core and the rejoin,
without Kafka. A simulated worker with `slots` slots joins, grants credit on freed slots,
receives assignments through a lossy connection (what is in flight is lost when it
reconnects), acks, gets stuck past deadlines (timeouts), reconnects, and moves to a new term
(a core rebuilt from the events so far). Invariant: the jobs the worker runs never exceed its
slots, and the jobs the leader has on it are among those it holds plus its credit."""

from __future__ import annotations

import contextlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch.api.worker_sync import rejoin
from dispatch.core import CoreConfig, Dispatcher, SubmitRequest
from dispatch.core.errors import Rejected
from dispatch.core.events import Assigned, Event, Reassigned

SLOTS = 2
WORKER = "w"
OWNER = "key"
CONFIG = CoreConfig(default_cap=100, ack_timeout_s=10.0, max_ack_timeout_s=10.0, max_attempts=5)

OPERATIONS = st.lists(
    st.sampled_from(["submit", "deliver", "finish", "timeout", "reconnect", "new_term"]),
    max_size=40,
)


class Sim:
    def __init__(self) -> None:
        self.core = Dispatcher(CONFIG)
        self.log: list[Event] = []
        self.now = 1000.0
        self.running: dict[str, tuple[int, str]] = {}  # job id -> (attempt, lease)
        self.in_flight: list[tuple[str, int, str]] = []  # committed, not yet received
        self.jobs = 0
        self.epoch = 0
        self.new_term()

    def apply(self, events: list[Event]) -> None:
        self.log += events
        for event in events:
            if isinstance(event, Assigned | Reassigned) and event.worker_id == WORKER:
                self.in_flight.append((event.job_id, event.attempt, event.lease))

    def hello(self) -> None:
        self.in_flight.clear()  # lost with the old connection
        held = [(job_id, attempt, lease) for job_id, (attempt, lease) in self.running.items()]
        self.apply(
            rejoin(self.core, WORKER, ["job.>"], self.now, held=held,
                   credits=SLOTS - len(self.running), owner=OWNER)
        )  # fmt: skip

    def new_term(self) -> None:
        core = Dispatcher(CONFIG)
        core.apply_all(self.log)
        self.epoch += 1
        self.core = core
        self.log += core.begin_epoch(self.core.fence.epoch + 1, self.now)
        self.apply(core.resume(self.now))
        self.hello()

    def step(self, operation: str) -> None:
        self.now += 1.0
        core = self.core
        if operation == "submit":
            self.jobs += 1
            request = SubmitRequest(id=f"j{self.jobs}", exec="x", client_id="c", payload=None)
            self.apply(core.submit(request, self.now))
        elif operation == "deliver" and self.in_flight:
            job_id, attempt, lease = self.in_flight.pop(0)
            self.running[job_id] = (attempt, lease)
        elif operation == "finish" and self.running:
            job_id = sorted(self.running)[0]
            attempt, lease = self.running.pop(job_id)
            # A stale ack is refused; the slot is free anyway.
            with contextlib.suppress(Rejected):
                self.apply(core.ack(job_id, attempt, lease, self.now, worker_id=WORKER))
            self.apply(core.grant_credit(WORKER, 1, self.now))
        elif operation == "timeout":
            self.now += 11.0
            # An open socket keeps its worker known: the node heartbeats for it.
            self.apply(core.worker_heartbeat(WORKER, self.now))
            self.apply(core.tick(self.now))
        elif operation == "reconnect":
            self.hello()
        elif operation == "new_term":
            self.new_term()

    def check(self) -> None:
        assert len(self.running) <= SLOTS, self.running
        worker = self.core.worker(WORKER)
        assert worker is not None
        unreceived = {job_id for job_id, _, _ in self.in_flight}
        on_leader = set(worker.running)
        # What the leader has on the worker: held, or on its way (paid for with credit).
        assert on_leader <= set(self.running) | unreceived, (on_leader, self.running)
        assert len(self.running) + len(self.in_flight) + worker.credit <= SLOTS


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPERATIONS)
def test_credit_stays_exact_across_reassignment_reconnection_and_failover(
    operations: list[str],
) -> None:
    sim = Sim()
    sim.check()
    for operation in operations:
        sim.step(operation)
        sim.check()
